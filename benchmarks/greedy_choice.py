"""A greedy step's filters and token choice: the fused kernel against PyTorch, whole transcriptions.

    PYTHONPATH=. .venv/bin/python benchmarks/greedy_choice.py [--compute_type int8] [--pairs 6]

One process, one model, the long-form files of ../shared (float32 greedy at temperature 0, as
``bench.py`` runs it): each file transcribed with the fused choice (``decoding/greedy_choice.py``) and
with its twin (the filters then ``GreedySearch.update``, the kernel hidden), in alternating order, pair
after pair, so both ways see the same machine (``alternate.py``). Prints per way the median whole time,
the median time of the choice per step (filters, token, log-probability; timed around
``WindowDecode._advance``), and whether the transcripts' words are the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternate import StepTimer, alternate, setting  # noqa: E402
from provenance import describe  # noqa: E402

import whisperkv  # noqa: E402
from whisperkv.decoding import greedy_choice  # noqa: E402
from whisperkv.decoding.window import WindowDecode  # noqa: E402


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
    timer = StepTimer()
    WindowDecode._advance = timer.wrap(WindowDecode._advance)  # this process only

    print(f"model tiny.en ({args.compute_type}); greedy, temperature 0; {args.pairs} pairs, order alternated")
    fused, torch_choice = (setting(greedy_choice, "_kernel_fn", fn) for fn in (kernel, lambda: None))
    alternate(model, {"fused": fused, "torch": torch_choice}, timer, args.pairs, "choice ms/step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
