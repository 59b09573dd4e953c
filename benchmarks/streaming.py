"""Live transcription on the long-form files: the valid path against forced naive reuse, and the goals.

    PYTHONPATH=. .venv/bin/python benchmarks/streaming.py            # both long files, 1 s chunks
    PYTHONPATH=. .venv/bin/python benchmarks/streaming.py --seconds 60   # the first minute of each

For each file of ../shared/data/speech/long/ (references: manifest.tsv's text of the concatenated clips):
* offline: ``transcribe()`` (greedy, the fallback schedule) on the whole file;
* valid: ``whisperkv stream``'s path — silero VAD, LocalAgreement-2, 1 s chunks, a simulated clock that
  advances by the measured compute (while an update computes for X s, X s more audio arrive); reuse
  only on exact provenance;
* naive: the same, but every other update reuses the previous update's encoder output and Cross-KV for
  the grown buffer without a check (``decode_window(..., force_reuse=True)``), the way a skip-encode
  optimisation would. Each such update's inputs are then decoded again on the valid path, to count how
  many produced a different text from the same buffer and prompt.
Latency is per committed word: stream time at the commit minus the word's end. Timings on a shared
machine are noisy: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

import whisperkv
from whisperkv.audio import load_audio
from whisperkv.metrics import word_errors
from whisperkv.stream.clock import SimulatedClock
from whisperkv.stream.local_decoder import LocalDecoder
from whisperkv.stream.runner import run_stream
from whisperkv.stream.session import StreamingSession
from whisperkv.stream.vad import SpeechDetector, silero

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech"
SR = 16000


class ArraySource:
    def __init__(self, audio: np.ndarray) -> None:
        self.audio, self.position = audio, 0

    def read(self, n: int) -> np.ndarray:
        out = self.audio[self.position : self.position + n]
        self.position += len(out)
        return out


def stream(model, audio: np.ndarray, chunk: float, naive: bool, fixed_cost: float | None = None) -> dict:
    decoder = LocalDecoder(model, naive_reuse=naive)
    decoder.record = [] if naive else None
    session = StreamingSession(decoder, vad=SpeechDetector())
    clock = SimulatedClock(fixed_cost)
    latencies = []
    for event in run_stream(ArraySource(audio), session, clock, chunk):
        if event.type == "commit":
            latencies += [event.audio_time - w.end for w in event.words]
    return {
        "text": session.committed_text(),
        "compute": clock.compute,
        "latencies": latencies,
        "updates": decoder.updates,
        "encodes": decoder.encodes,
        "reuse": decoder.reuse_summary(),
        "record": decoder.record,
    }


def differing_updates(model, record: list[dict]) -> tuple[int, int]:
    """(stale updates whose text differs from the valid decode of the same inputs, stale updates)."""
    stale = [r for r in record if r["stale"]]
    differ = 0
    for r in stale:
        valid = LocalDecoder(model).decode(r["audio"], r["start"], r["prompt"])
        differ += valid.text != r["text"]
    return differ, len(stale)


def p95(values: list[float]) -> float:
    return float(np.percentile(values, 95)) if values else float("nan")


def machine() -> str:
    cpu = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    versions = [f"python {platform.python_version()}", f"torch {torch.__version__}", f"whisperkv {commit}"]
    for name in ("silero_vad", "onnxruntime"):
        try:
            module = silero() if name == "silero_vad" else __import__(name)
            versions.append(f"{name} {module.__version__}")
        except (ImportError, AttributeError):
            versions.append(f"{name} ?")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"CPU: {cpu}; {os.cpu_count()} cores, torch threads {torch.get_num_threads()}; load average {load}\n"
        + ("; ".join(versions))
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--chunk", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=None, help="only the first SECONDS of each file")
    p.add_argument(
        "--simulate_compute",
        type=float,
        default=None,
        metavar="SECONDS",
        help="clock cost per update instead of the measured time (policy tuning on a busy machine)",
    )
    p.add_argument("--no_naive", action="store_true", help="skip the naive-reuse path")
    args = p.parse_args()
    rows = [
        r
        for r in csv.DictReader(open(SPEECH / "manifest.tsv", encoding="utf-8"), delimiter="\t")
        if r["file"].startswith("long/")
    ]
    if not rows:
        print(f"no long-form files under {SPEECH}", file=sys.stderr)
        return 2
    print(machine(), flush=True)
    model = whisperkv.load_model(args.model)
    totals = {k: [0, 0] for k in ("offline", "valid", "naive")}
    latencies: list[float] = []
    compute = {"valid": 0.0, "naive": 0.0}
    audio_seconds = 0.0
    differ = stale = updates = 0
    header = (
        f"{'file':<34} {'path':<8} {'WER':>6} {'compute/s':>9} {'lat mean':>8} {'lat p95':>8} {'enc/upd':>9}"
    )
    lines = [header, "-" * len(header)]
    print(header, flush=True)
    for row in rows:
        audio = load_audio(SPEECH / row["file"])
        if args.seconds:
            audio = audio[: int(args.seconds * SR)]
        reference = row["reference"] if not args.seconds else None
        duration = len(audio) / SR
        audio_seconds += duration
        name = Path(row["file"]).name[:34]
        t0 = time.perf_counter()
        offline = model.transcribe(audio)["text"]
        offline_run = {"text": offline, "compute": time.perf_counter() - t0}
        ref = reference if reference is not None else offline  # a cut file: offline text is the reference
        for path in ("offline", "valid", "naive"):
            if path == "offline":
                run = offline_run
            elif path == "valid":
                run = stream(model, audio, args.chunk, False, args.simulate_compute)
                latencies += run["latencies"]
            elif args.no_naive:
                continue
            else:
                run = stream(model, audio, args.chunk, True, args.simulate_compute)
                d, s = differing_updates(model, run["record"])
                differ, stale, updates = differ + d, stale + s, updates + run["updates"]
            errors, words = word_errors(ref, run["text"])
            totals[path][0] += errors
            totals[path][1] += words
            if path in compute:
                compute[path] += run["compute"]
            lat = run.get("latencies")
            cells = (
                f"{statistics.mean(lat):>8.2f} {p95(lat):>8.2f} {run['encodes']:>4}/{run['updates']:<4}"
                if lat
                else f"{'':>8} {'':>8} {'':>9}"
            )
            lines.append(
                f"{name:<34} {path:<8} {errors / words:>6.1%} {run['compute'] / duration:>9.3f} {cells}"
            )
            print(lines[-1], f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    wers = {k: e / max(w, 1) for k, (e, w) in totals.items()}
    ref_kind = (
        "manifest references (concatenated clip texts)" if not args.seconds else "offline transcribe() text"
    )
    clock = "measured compute" if args.simulate_compute is None else f"{args.simulate_compute:g} s per update"
    print(
        f"\n{args.model}, {args.chunk:g} s chunks, clock: {clock}, {audio_seconds:.1f} s of audio; "
        f"WER against {ref_kind}"
    )
    print("\n".join(lines))
    saved = compute["valid"] - compute["naive"]
    print(
        f"\nnaive reuse: {stale} of {updates} updates reused a stale encoder output/Cross-KV; "
        f"{differ} of them ({differ / max(stale, 1):.0%}) gave a different text from the valid decode of "
        f"the same "
        f"buffer and prompt ({differ / max(updates, 1):.0%} of all updates); time saved {saved:.1f} s "
        f"({saved / max(compute['valid'], 1e-9):.0%} of the valid path's compute); "
        f"WER {wers['naive']:.1%} vs valid {wers['valid']:.1%}"
    )
    goals = [
        (
            f"final WER within 2 points of offline ({wers['valid']:.1%} vs {wers['offline']:.1%})",
            wers["valid"] <= wers["offline"] + 0.02,
        ),
        (
            f"mean commit latency <= 2.0 s ({statistics.mean(latencies):.2f} s)",
            statistics.mean(latencies) <= 2.0,
        ),
        (f"p95 commit latency <= 4.0 s ({p95(latencies):.2f} s)", p95(latencies) <= 4.0),
        (
            f"compute per second of audio < 0.5 s ({compute['valid'] / audio_seconds:.3f} s)",
            compute["valid"] / audio_seconds < 0.5,
        ),
    ]
    print("\ngoals (valid path):")
    for text, met in goals:
        print(f"  {'met    ' if met else 'NOT met'}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
