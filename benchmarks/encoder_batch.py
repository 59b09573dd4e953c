"""Does encoding several requests' windows in one call pay? The encoder's ms per window at each group size.

    PYTHONPATH=. .venv/bin/python benchmarks/encoder_batch.py                       # float32 and int8
    PYTHONPATH=. .venv/bin/python benchmarks/encoder_batch.py --compute_types int8 --rounds 9
    PYTHONPATH=. .venv/bin/python benchmarks/encoder_batch.py --model small --windows 4 --rounds 2

``--model`` takes tiny.en (the embedded weights) or a size name (small, large-v3-turbo, ...): random
weights of that size's real dimensions from a fixed seed (``model/random_weights.py``), written to a
temporary directory; the encoder's cost depends on the shapes, not on what the weights learned.

Each compute type runs in its own process (a fresh interpreter per type: the int8 type's kernels and
threads are not left behind for the other). In it, 8 short English clips' 30 s windows (padded as the
server pads them) are encoded as the server's scheduler would: ``model.embed_audio`` on a batch of
``group`` windows at a time, then each window's Cross-KV projected on its own. Rounds interleave the
group sizes (1, 2, 4, 8), so every size sees the same machine; the medians are printed, with each size's
speed against one window at a time. Before timing, every window's encoder output and Cross-KV from a
batch are compared with the same window's alone: the batch changes no bit, or the script says which
differ and by how much.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO.parent / "shared" / "data" / "speech"
GROUPS = (1, 2, 4, 8)


def _windows(n: int, n_mels: int):  # noqa: ANN202 - a tensor [n, n_mels, 3000]
    import csv

    import torch

    from whisperkv.audio import N_FRAMES, N_SAMPLES, load_audio, log_mel_spectrogram, pad_or_trim

    with open(SPEECH / "manifest.tsv", encoding="utf-8", newline="") as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t") if r["language"] == "en"]
    rows = [r for r in rows if float(r["duration_s"]) <= 30][:n]
    mels = [
        pad_or_trim(log_mel_spectrogram(load_audio(SPEECH / r["file"]), n_mels, padding=N_SAMPLES), N_FRAMES)
        for r in rows
    ]
    return torch.stack(mels)


def _encode(model, mels, group: int) -> list:  # noqa: ANN001 - a Whisper and a tensor
    """Every window's (features, Cross-KV keys) encoded ``group`` windows to a call, as the scheduler does."""
    out = []
    for start in range(0, mels.shape[0], group):
        part = mels[start : start + group]
        features = model.embed_audio(part)
        for k in range(part.shape[0]):
            provenance = model.encoder_provenance(part[k : k + 1], 0, None)
            cross = model.decoder.project_cross_kv(features[k : k + 1], provenance)
            out.append((features[k : k + 1], [kv.key for kv in cross] + [kv.value for kv in cross]))
    return out


def _load(name: str, compute_type: str):  # noqa: ANN202 - a Whisper
    import tempfile

    import whisperkv

    if name == "tiny.en":
        return whisperkv.load_model(name, compute_type=compute_type)
    from whisperkv.model.random_weights import write_random_model

    with tempfile.TemporaryDirectory(prefix="whisperkv-encoder-batch-") as directory:
        path = write_random_model(name, directory, seed=0)
        return whisperkv.load_model(str(path), compute_type=compute_type)


def measure(name: str, compute_type: str, windows: int, rounds: int, groups: tuple[int, ...]) -> dict:
    """In this process: bits of a batch against alone, then ms per window per group size (medians)."""
    import torch

    import whisperkv.model.whisper as whisper_module

    model = _load(name, compute_type)
    mels = _windows(windows, model.dims.n_mels)
    whisper_module.CPU_ENCODER_GROUP = max(groups)  # the group is the call's batch, nothing splits it
    with torch.no_grad():
        alone = _encode(model, mels, 1)
        differ = {}
        for group in groups[1:]:
            together = _encode(model, mels, group)
            worst = 0.0
            for (fa, ka), (fb, kb) in zip(alone, together, strict=True):
                for a, b in zip([fa, *ka], [fb, *kb], strict=True):
                    if not torch.equal(a, b):
                        worst = max(worst, float((a.float() - b.float()).abs().max()))
            differ[group] = worst
        times: dict[int, list[float]] = {g: [] for g in groups}
        for _ in range(rounds):
            for group in groups:
                started = time.perf_counter()
                _encode(model, mels, group)
                times[group].append((time.perf_counter() - started) * 1000 / mels.shape[0])
    return {
        "compute_type": compute_type,
        "digest": model.weights_digest,
        "threads": torch.get_num_threads(),
        "differ": differ,
        "ms": {g: statistics.median(t) for g, t in times.items()},
        "spread": {g: (min(t), max(t)) for g, t in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny.en", help="tiny.en, or a size name for random weights")
    parser.add_argument("--compute_types", nargs="+", default=["float32", "int8"])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--groups", type=int, nargs="+", default=list(GROUPS), help="windows a call")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.model, args.child, args.windows, args.rounds, tuple(args.groups))))
        return
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for compute_type in args.compute_types:
        child = [sys.executable, __file__, "--child", compute_type, "--windows", str(args.windows)]
        child += ["--rounds", str(args.rounds), "--model", args.model, "--groups", *map(str, args.groups)]
        out = subprocess.run(child, env=env, capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        what = f"{args.model} {compute_type} ({r['digest']}, {r['threads']} threads)"
        print(f"\n{what}, {args.windows} windows, median of {args.rounds} interleaved rounds:")
        one = r["ms"]["1"]
        for group in args.groups:
            lo, hi = r["spread"][str(group)]
            ms = r["ms"][str(group)]
            bits = "" if group == 1 else (
                "  bits: identical to alone" if r["differ"][str(group)] == 0
                else f"  bits: DIFFER from alone, max |Δ| {r['differ'][str(group)]:.3g}"
            )  # fmt: skip
            print(f"  {group} window(s) a call: {ms:7.1f} ms/window ({lo:.1f}-{hi:.1f}), "
                  f"{one / ms:.2f}x one at a time{bits}")  # fmt: skip
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
