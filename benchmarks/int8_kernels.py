"""int8 kernels for a one-token decoder step: dynamic activation quantisation vs weight-only int8.

    PYTHONPATH=. .venv/bin/python benchmarks/int8_kernels.py [--threads 1] [--repeats 15]

For each decoder-shaped product of tiny.en (fused query/key/value, MLP up and down, the vocabulary
projection) on one row: ``Int8Linear`` (``quantized::linear_dynamic``: int8 weights with per-row scales,
activations quantised per call) against ``aten._weight_int8pack_mm`` (the same int8 weights and scales,
activations kept in bfloat16; with float32 activations this kernel has no fast path here). Prints the
median ms of each, interleaved, and each one's largest error against the float32 product.
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

SHAPES = {
    "query|key|value": (1152, 384),
    "MLP up": (1536, 384),
    "MLP down": (384, 1536),
    "vocabulary": (51864, 384),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from whisperkv.model.quantize import Int8Linear

    print(describe(args.threads))
    header = f"{'product':<18}{'out x in':>14}{'dynamic ms':>12}{'int8pack ms':>13}"
    print(f"\n{header}{'dyn err':>10}{'pack err':>10}")
    gen = torch.Generator().manual_seed(0)
    for name, (rows, cols) in SHAPES.items():
        weight = torch.randn(rows, cols, generator=gen) * 0.05
        x = torch.randn(1, cols, generator=gen)
        dynamic = Int8Linear(weight, None)
        scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
        qweight = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
        scales_bf16 = scales.to(torch.bfloat16)

        def packed(x=x, qweight=qweight, scales=scales_bf16) -> torch.Tensor:
            return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), qweight, scales).float()

        calls = {"dynamic": lambda x=x, dynamic=dynamic: dynamic(x), "int8pack": packed}
        reference = x @ weight.T
        errors = {k: float((f() - reference).abs().max()) for k, f in calls.items()}
        times: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(args.repeats):
            for k, f in calls.items():
                start = time.perf_counter()
                for _ in range(5):
                    f()
                times[k].append((time.perf_counter() - start) / 5 * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"{name:<18}{f'{rows}x{cols}':>14}{med['dynamic']:>12.4f}{med['int8pack']:>13.4f}"
            f"{errors['dynamic']:>10.4f}{errors['int8pack']:>10.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
