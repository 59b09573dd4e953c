"""int8 kernels for a decoder step: fbgemm's dynamic quantisation, the rows kernel, weight-only int8.

    PYTHONPATH=. .venv/bin/python benchmarks/int8_kernels.py [--threads 2] [--rows 1,5,40] [--repeats 15]

For each decoder-shaped product of tiny.en (fused query/key/value, MLP up and down, the vocabulary
projection) on ``--rows`` rows (1: greedy, 5: a beam-5 window, 40: batched beam 5): ``Int8Linear``
through fbgemm (``quantized::linear_dynamic``: int8 weights with per-row scales, one activation scale
per call), through the C rows kernel (``model/int8_rows.py``: the same int8 weights, one scale per
row), and ``aten._weight_int8pack_mm`` (activations kept in bfloat16). Each is timed warm (the same
weights again) and cold (64 MB of other data written between calls, as a real step's other reads do),
interleaved, medians in microseconds; each one's largest error against the float32 product beside.
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
    p.add_argument("--rows", default="1", help="comma list of row counts")
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from whisperkv.model.int8_rows import load_rows_kernel
    from whisperkv.model.quantize import Int8Linear

    print(describe(args.threads))
    kernel = load_rows_kernel()
    print("rows kernel:", "not built (no C compiler)" if kernel is None else "built")
    ways = ["fbgemm", "rows kernel", "int8pack"] if kernel is not None else ["fbgemm", "int8pack"]
    header = f"{'product':<16}{'out x in':>11}{'rows':>5}"
    header += "".join(f"{w + ' ' + c:>18}" for c in ("warm", "cold") for w in ways)
    print(f"\n{header}  max |error| " + ", ".join(ways))
    gen = torch.Generator().manual_seed(0)
    flush = torch.empty(16 * 1024 * 1024)
    for name, (out, width) in SHAPES.items():
        weight = torch.randn(out, width, generator=gen) * 0.05
        layers = {"fbgemm": [Int8Linear(weight, None) for _ in range(3)]}
        if kernel is not None:
            layers["rows kernel"] = [Int8Linear(weight, None, kernel) for _ in range(3)]
        scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
        qweight = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
        packs = [(qweight.clone(), scales.to(torch.bfloat16)) for _ in range(3)]
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, width, generator=gen)

            def call(
                way: str, i: int, x: torch.Tensor = x, layers: dict = layers, packs: list = packs
            ) -> torch.Tensor:
                if way == "int8pack":
                    q, s = packs[i]
                    return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), q, s).float()
                return layers[way][i](x)

            reference = x @ weight.T
            errors = [float((call(w, 0) - reference).abs().max()) for w in ways]
            times: dict[tuple[str, bool], list[float]] = {(w, c): [] for w in ways for c in (False, True)}
            for n in range(args.repeats):
                for cold in (False, True):
                    for way in ways:
                        if cold:
                            flush.add_(1.0)
                        else:  # warm: the same weights and input just read
                            call(way, n % 3)
                        start = time.perf_counter()
                        call(way, n % 3)
                        times[(way, cold)].append(time.perf_counter() - start)
            row = "".join(
                f"{statistics.median(times[(w, c)]) * 1e6:>16.0f}us" for c in (False, True) for w in ways
            )
            print(f"{name:<16}{f'{out}x{width}':>11}{rows:>5}{row}  " + ", ".join(f"{e:.4f}" for e in errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
