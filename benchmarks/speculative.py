"""Exact speculative greedy decoding against the plain loop, side by side in one process, one run.

    PYTHONPATH=. .venv/bin/python benchmarks/speculative.py [--models tiny.en,base] [--seconds 120]

For each model and each file (``bench.py``'s long-form file and its file of many short utterances with
pauses, both built at run time from ../shared), greedy at temperature 0 with the default fallback:
the plain loop (one float32 row a step) and the int8 draft checked k = 1 and k = 2 guesses a step
(``load_model(speculative=True)``, ``decoding/speculative.py``), interleaved and repeated
(``--repeats``); medians printed, with the float32 steps, the tokens, the share of guesses that were
right, and whether the transcript (tokens and scores) is the plain loop's. One model object serves all
three (the draft is detached for the plain runs), so the weights are the same.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import build_audio  # noqa: E402
from provenance import describe  # noqa: E402


def _run(model, audio, per_step: int | None) -> tuple[float, dict, dict]:
    from whisperkv.engine import Scheduler

    draft = model.decoder.draft
    if per_step is None:
        model.decoder.draft = None
    else:
        draft.per_step = per_step
    try:
        scheduler = Scheduler(model)
        start = time.perf_counter()
        result = scheduler.run(scheduler.submit(audio, {"temperature": (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)}))
        return time.perf_counter() - start, result, scheduler.stats()
    finally:
        model.decoder.draft = draft


def _scores(result: dict) -> list:
    return [(s["tokens"], s["avg_logprob"]) for s in result["segments"]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--seconds", type=float, default=120.0, help="length of each built file")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import whisperkv

    print(describe(args.threads))
    audios, _ = build_audio(args.seconds, args.seconds)
    lengths = {file: len(audios[file]) / 16000 for file in ("long", "utterances")}
    print("files: " + ", ".join(f"{file} {seconds:.0f} s" for file, seconds in lengths.items()))
    modes = {"plain": None, "draft k=1": 1, "draft k=2": 2}
    header = f"{'model':<8}{'file':<12}{'mode':<11}{'median s':>9}{'ratio':>7}{'steps':>7}{'tokens':>7}"
    print(f"\n{header}{'right':>7}  same transcript")
    for name in args.models.split(","):
        model = whisperkv.load_model(name, speculative=True)
        _run(model, audios["warmup"], 1)  # one-off costs (thread pools, page faults) before timing
        for file in ("utterances", "long"):
            times: dict[str, list[float]] = {mode: [] for mode in modes}
            last: dict[str, tuple[dict, dict]] = {}
            for _ in range(args.repeats):
                for mode, per_step in modes.items():
                    seconds, result, stats = _run(model, audios[file], per_step)
                    times[mode].append(seconds)
                    last[mode] = (result, stats)
            plain = statistics.median(times["plain"])
            for mode in modes:
                result, stats = last[mode]
                median = statistics.median(times[mode])
                tokens = sum(len(s["tokens"]) for s in result["segments"])
                guessed = stats["draft_guesses"]
                right = f"{100 * stats['draft_accepted'] / guessed:.0f}%" if guessed else "-"
                same = "yes" if _scores(result) == _scores(last["plain"][0]) else "NO"
                print(
                    f"{name:<8}{file:<12}{mode:<11}{median:>9.2f}{median / plain:>7.2f}"
                    f"{stats['steps_total']:>7}{tokens:>7}{right:>7}  {same}",
                    flush=True,
                )
        del model
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
