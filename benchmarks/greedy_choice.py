"""A greedy step's filters and token choice: the fused kernel against PyTorch, whole transcriptions.

    PYTHONPATH=. .venv/bin/python benchmarks/greedy_choice.py [--compute_type int8] [--pairs 6]

One process, one model, the long-form files of ../shared (float32 greedy at temperature 0, as
``bench.py`` runs it): each file transcribed with the fused choice (``decoding/greedy_choice.py``) and
with its twin (the filters then ``GreedySearch.update``, the kernel hidden), in alternating order, pair
after pair, so both ways see the same machine. Prints per way the median whole time, the median time
of the choice per step (filters, token, log-probability; timed around ``WindowDecode._advance``), and
whether the transcripts' words are the same.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import describe  # noqa: E402

import whisperkv  # noqa: E402
from whisperkv.decoding import greedy_choice  # noqa: E402
from whisperkv.decoding.window import WindowDecode  # noqa: E402

LONG = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech" / "long"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compute_type", default="default", choices=["default", "int8"])
    p.add_argument("--pairs", type=int, default=6)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(describe(args.threads))
    kernel = greedy_choice._kernel_fn
    if kernel() is None:
        print("no C compiler found: the kernel cannot be built here")
        return 1
    model = whisperkv.load_model("tiny.en", compute_type=args.compute_type)
    advance, spent = WindowDecode._advance, [0.0, 0]

    def timed_advance(self: WindowDecode, logits: torch.Tensor) -> None:
        start = time.perf_counter()
        advance(self, logits)
        spent[0] += time.perf_counter() - start
        spent[1] += 1

    WindowDecode._advance = timed_advance  # this process only
    print(f"model tiny.en ({args.compute_type}); greedy, temperature 0; {args.pairs} pairs, order alternated")
    print(f"{'file':<42}{'way':<8}{'median s':>10}{'choice ms/step':>16}  runs (s)")
    for path in sorted(LONG.glob("*.flac")):
        audio = whisperkv.load_audio(path)
        model.transcribe(audio, language="en")  # first call pays one-off costs
        runs: dict[str, list[tuple[float, float]]] = {"fused": [], "torch": []}
        texts: dict[str, str] = {}
        for pair in range(args.pairs):
            for way in ("fused", "torch") if pair % 2 == 0 else ("torch", "fused"):
                greedy_choice._kernel_fn = kernel if way == "fused" else (lambda: None)
                spent[:] = [0.0, 0]
                start = time.perf_counter()
                texts[way] = model.transcribe(audio, language="en")["text"]
                runs[way].append((time.perf_counter() - start, spent[0] / max(spent[1], 1) * 1e3))
        greedy_choice._kernel_fn = kernel
        for way, measured in runs.items():
            whole = statistics.median(t for t, _ in measured)
            choice = statistics.median(c for _, c in measured)
            listed = " ".join(f"{t:.2f}" for t, _ in measured)
            print(f"{path.name:<42}{way:<8}{whole:>10.3f}{choice:>16.3f}  {listed}")
        fused = statistics.median(t for t, _ in runs["fused"])
        ratio = fused / statistics.median(t for t, _ in runs["torch"])
        same = texts["fused"].split() == texts["torch"].split()
        print(f"{'':<42}fused / torch {ratio:.2f}; same words: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
