"""Beam search's top k per step: ``torch.topk`` against ``decoding/top_k.py`` (the C kernel).

    PYTHONPATH=. .venv/bin/python benchmarks/top_k.py [--threads 2]

Rows as beam search hands them over: the log-softmax of 51,864 logits (scaled normals, a third of the
vocabulary suppressed to -inf as the filters do), k = beam size + 1 = 6, for 5 rows (one beam-5 window),
40 (batched mode's 8 windows) and 80. Eight sets of rows used in turn, so a call does not find the
last call's rows in the CPU cache; both ways interleaved, medians. The last column checks the answers
are torch.topk's (values and indices).
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

from whisperkv.decoding.top_k import _kernel_fn, top_k  # noqa: E402

VOCAB = 51_864


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--repeats", type=int, default=201)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(describe(args.threads))
    if _kernel_fn() is None:
        print("no C compiler found: the kernel cannot be built here")
        return 1
    generator = torch.Generator().manual_seed(0)
    print(f"\n{'rows':>5} {'torch.topk ms':>14} {'top_k ms':>9} {'ratio':>6}  same answers")
    for rows in (5, 40, 80):
        sets = []
        for _ in range(8):
            logits = torch.randn(rows, VOCAB, generator=generator) * 3
            logits[:, ::3] = float("-inf")
            sets.append(torch.log_softmax(logits, dim=-1))
        same = all(
            torch.equal(a, b) for x in sets for a, b in zip(top_k(x, 6), x.topk(6, dim=-1), strict=True)
        )
        times: dict[str, list[float]] = {"torch": [], "kernel": []}
        for i in range(args.repeats):
            x = sets[i % len(sets)]
            for name, fn in (("torch", lambda x=x: x.topk(6, dim=-1)), ("kernel", lambda x=x: top_k(x, 6))):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        torch_ms, kernel_ms = (statistics.median(times[n]) * 1e3 for n in ("torch", "kernel"))
        ratio = kernel_ms / torch_ms
        print(f"{rows:>5} {torch_ms:>14.3f} {kernel_ms:>9.3f} {ratio:>6.2f}  {'yes' if same else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
