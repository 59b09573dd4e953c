"""What continuous batching buys: N jobs through one Scheduler at once vs the same jobs one after another.

    PYTHONPATH=. .venv/bin/python benchmarks/engine_batching.py            # 8 short English clips, 3 rounds
    PYTHONPATH=. .venv/bin/python benchmarks/engine_batching.py --jobs 4 --rounds 1

Both modes run the same Scheduler code on the same model; "serial" submits a job only when the previous
one finished, "batched" submits them all and lets their decoder steps share one batch. Rounds alternate
serial / batched and the medians are printed, with the machine they came from. It also checks that
every batched result equals its serial one (the engine's invariant), and says so.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import whisperkv
from whisperkv.engine import Scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import cpu_model  # noqa: E402

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech"
CLIPS = [
    "jfk.flac",
    "lj_LJ001-0001.flac",
    "lj_LJ001-0002.flac",
    "lj_LJ001-0003.flac",
    "ls_1089-134686-0000.flac",
    "ls_1089-134686-0001.flac",
    "timit_LDC93S1.wav",
    "mfa_acoustic_corpus.wav",
]


def run_serial(model, audios: list) -> tuple[float, list[dict]]:
    start = time.perf_counter()
    scheduler = Scheduler(model)
    results = [scheduler.run(scheduler.submit(a)) for a in audios]
    return time.perf_counter() - start, results


def run_batched(model, audios: list, max_batch: int) -> tuple[float, list[dict], int]:
    start = time.perf_counter()
    scheduler = Scheduler(model, max_batch=max_batch)
    handles = [scheduler.submit(a) for a in audios]
    widest = 0
    while not all(h.done for h in handles):
        scheduler.tick()
        widest = max(widest, scheduler.stats()["last_batch_rows"])
    return time.perf_counter() - start, [h.result() for h in handles], widest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max_batch", type=int, default=16)
    args = parser.parse_args()
    model = whisperkv.load_model("tiny.en")
    names = (CLIPS * ((args.jobs + len(CLIPS) - 1) // len(CLIPS)))[: args.jobs]
    audios = [whisperkv.load_audio(SPEECH / "en" / n) for n in names]
    seconds = sum(len(a) for a in audios) / 16000
    model.transcribe(audios[0][:16000])  # warm-up: weights digest, tokenizer, first-call allocations
    serial, batched, same = [], [], True
    widest = 0
    for _ in range(args.rounds):
        t, serial_results = run_serial(model, audios)
        serial.append(t)
        t, batched_results, widest = run_batched(model, audios, args.max_batch)
        batched.append(t)
        same = same and batched_results == serial_results
    s, b = statistics.median(serial), statistics.median(batched)
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print(
        f"jobs: {args.jobs} clips, {seconds:.1f} s of audio; rounds: {args.rounds} "
        "(medians; serial and batched alternate)"
    )
    print(
        f"one after another: {s:.2f} s  ({seconds / s:.2f} audio s/s)   "
        f"all rounds: {[round(x, 2) for x in serial]}"
    )
    print(
        f"batched (max_batch {args.max_batch}, widest step {widest} rows): {b:.2f} s  "
        f"({seconds / b:.2f} audio s/s)   all rounds: {[round(x, 2) for x in batched]}"
    )
    print(f"speed-up: {s / b:.2f}x; batched results identical to serial: {same}")


if __name__ == "__main__":
    main()
