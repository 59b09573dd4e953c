"""The int8 type's step attention kernel against PyTorch's SDPA, shape by shape (the figures RESULTS quotes).

    PYTHONPATH=. .venv/bin/python benchmarks/attend_kernel.py [--threads 2] [--model tiny.en|base]

For each shape a decoder step asks for (one query over a window's Cross-KV; five, a beam-5 window; five
windows of five beams, batched mode; a Self-KV of 60 positions), both are timed warm (the same keys
again) and cold (64 MB of other data written between calls, as a real step's other reads do), medians,
interleaved; the largest difference between their outputs is printed beside. The kernel is also timed
over the same caches held in bfloat16 (the int8 type's caches since round 7), with its largest difference
from the float32 caches' output.
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

from whisperkv.cpu.attend import load_kernel  # noqa: E402
from whisperkv.model.attention import attend  # noqa: E402
from whisperkv.model.dims import KNOWN_DIMS  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--model", default="tiny.en", choices=sorted(KNOWN_DIMS))
    p.add_argument("--repeats", type=int, default=61)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(describe(args.threads))
    kernel = load_kernel()
    if kernel is None:
        print("no C compiler found: the kernel cannot be built here")
        return 1
    dims = KNOWN_DIMS[args.model]
    heads, width = dims.n_text_head, dims.n_text_state
    print(f"kernel: {kernel.path}\nmodel {args.model}: {heads} heads of 64\n")
    generator = torch.Generator().manual_seed(0)
    flush = torch.empty(16 * 1024 * 1024)
    shapes = [  # name, windows, rows per window, positions, causal
        ("cross, 1 query", 1, 1, dims.n_audio_ctx, False),
        ("cross, beam 5", 1, 5, dims.n_audio_ctx, False),
        ("cross, 5 windows x beam 5", 5, 5, dims.n_audio_ctx, False),
        ("self, 60 positions, beam 5", 5, 1, 60, True),
    ]
    columns = f"{'SDPA warm':>10} {'kernel warm':>12} {'bf16 warm':>10}"
    columns += f" {'SDPA cold':>10} {'kernel cold':>12} {'bf16 cold':>10}"
    print(f"{'shape':<28} {columns}  max |diff| kernel-SDPA, bf16-kernel")
    for name, windows, rows, positions, causal in shapes:
        caches = [  # 4 sets, used in turn: a cold call does not find the last call's keys in the cache
            tuple(torch.randn(windows, heads, positions, 64, generator=generator) for _ in range(2))
            for _ in range(4)
        ]
        q = torch.randn(windows * rows, 1, width, generator=generator)
        offset = positions - 1 if causal else None
        assert kernel.accepts(q, *caches[0], offset)
        halves = [(k.bfloat16(), v.bfloat16()) for k, v in caches]
        assert kernel.accepts(q, *halves[0], offset)
        ways = {
            "sdpa": lambda k, v, q=q, offset=offset: attend(q, k, v, offset),
            "kernel": lambda k, v, q=q: kernel(q, k, v),
            "bf16": lambda k, v, q=q: kernel(q, k, v),
        }
        times: dict[tuple[str, bool], list[float]] = {(w, c): [] for w in ways for c in (False, True)}
        for i in range(args.repeats):
            for cold in (False, True):
                for way, fn in ways.items():
                    k, v = (halves if way == "bf16" else caches)[i % 4]
                    if cold:
                        flush.add_(1.0)
                    start = time.perf_counter()
                    fn(k, v)
                    times[(way, cold)].append(time.perf_counter() - start)
        exact = ways["kernel"](*caches[0])
        diff = (exact - ways["sdpa"](*caches[0])).abs().max().item()
        diff_bf16 = (ways["bf16"](*halves[0]) - exact).abs().max().item()
        us = {key: statistics.median(t) * 1e6 for key, t in times.items()}
        row = " ".join(f"{us[(way, cold)]:>8.0f}us" for cold in (False, True) for way in ways)
        print(f"{name:<28} {row}  {diff:.1e}, {diff_bf16:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
