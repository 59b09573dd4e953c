"""Throughput of `whisperkv batch` with 1 and 2 workers, local processes and Ray, on this machine.

    .venv/bin/python benchmarks/batch.py                   # every English clip, greedy, 3 interleaved rounds
    .venv/bin/python benchmarks/batch.py --files 12 --repeats 1 --beam_size 5

Each configuration is a fresh `whisperkv batch` process writing to a fresh folder (model loading, worker
start-up and, for Ray, starting a local Ray are all counted: that is what a user waits for). Rounds are
interleaved (local-1, local-2, ray-1, ray-2, local-1, ...) and the table reports medians. The inputs are
the shared clips referenced in place (a manifest in a temp folder), never copied.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import cpu_model  # noqa: E402

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech"
CONFIGS = [("local", 1), ("local", 2), ("ray", 1), ("ray", 2)]


def clips(n: int | None) -> list[tuple[str, float]]:
    with open(SPEECH / "manifest.tsv", encoding="utf-8", newline="") as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t") if r["language"] == "en"]
    rows = rows[:n] if n else rows
    return [(str(SPEECH / r["file"]), float(r["duration_s"])) for r in rows]


def run_once(manifest: Path, engine: str, workers: int, extra: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "whisperkv", "batch", str(manifest), "-o", out]
        cmd += ["--engine", engine, "--workers", str(workers), "--output_format", "txt", *extra]
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        records = [json.loads(line) for line in Path(out, "results.jsonl").read_text().splitlines()]
    return wall, {r["path"]: r["text"] for r in records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=None, help="first N English clips (default: all)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--beam_size", default="none", help="none (greedy) or a beam width")
    args = parser.parse_args()

    files = clips(args.files)
    audio_seconds = sum(d for _, d in files)
    extra = ["--beam_size", args.beam_size, "--best_of", "none" if args.beam_size == "none" else "5"]
    import ray
    import torch

    import whisperkv

    print(
        f"CPU: {cpu_model()}, {os.cpu_count()} cores; torch {torch.__version__}, ray {ray.__version__}, "
        f"whisperkv {whisperkv.__version__}; {len(files)} files, {audio_seconds:.1f} s of audio; "
        f"decoding: beam_size={args.beam_size}; {args.repeats} interleaved rounds, medians"
    )
    walls: dict[tuple[str, int], list[float]] = {c: [] for c in CONFIGS}
    texts: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        manifest = Path(tmp) / "files.txt"
        manifest.write_text("\n".join(p for p, _ in files) + "\n")
        for round_ in range(args.repeats):
            for config in CONFIGS:
                wall, text = run_once(manifest, *config, extra)
                walls[config].append(wall)
                texts[config] = text
                print(f"  round {round_ + 1}: {config[0]:<5} workers={config[1]}  {wall:7.1f} s", flush=True)
    reference = texts[CONFIGS[0]]
    print()
    print(
        f"{'engine':<7}{'workers':>8}{'median s':>10}{'audio s/s':>11}{'files/min':>11}"
        f"{'vs local-1':>12}  same text"
    )
    base = statistics.median(walls[CONFIGS[0]])
    for config in CONFIGS:
        m = statistics.median(walls[config])
        same = "yes" if texts[config] == reference else "NO"
        print(
            f"{config[0]:<7}{config[1]:>8}{m:>10.1f}{audio_seconds / m:>11.2f}{len(files) * 60 / m:>11.1f}"
            f"{base / m:>11.2f}x  {same}"
        )


if __name__ == "__main__":
    main()
