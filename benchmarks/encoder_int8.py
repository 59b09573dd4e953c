"""The encoder's linears and the int8 type's encoders at a size's width, timed on this CPU.

    PYTHONPATH=. .venv/bin/python benchmarks/encoder_int8.py                         # large-v3-turbo's width
    PYTHONPATH=. .venv/bin/python benchmarks/encoder_int8.py --size small --layers 2

Two tables, both interleaved and medians, each figure as wall ms and as CPU ms (the process's CPU time:
on a machine shared with other work the wall time moves with the others' load, the CPU time much less):

* one window's linear (1,500 positions; d -> 4d and 4d -> d) through float32 PyTorch (MKL: what
  ``F.linear`` calls here), float32 oneDNN (``torch.utils.mkldnn``), bfloat16 PyTorch (oneDNN), the
  int8 rows kernel (``cpu/int8_rows.py``: each position quantised on its own) and fbgemm (one scale a
  window), with each one's mean distance to the float64 product;
* one window through an encoder of ``--layers`` layers of the size's width (random weights): the int8
  type's ``bfloat16`` encoder (where the CPU multiplies bfloat16 natively), its ``int8 rows`` encoder
  (``cpu/int8_encoder.py``), that one's twin (PyTorch's block over the same int8 linears, the float32
  convolutions) and its ``int8`` encoder (fbgemm's linears, one scale a window), with each output's mean
  distance to the float32 encoder's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import describe  # noqa: E402

from whisperkv.cpu.int8_linear import Int8Linear  # noqa: E402
from whisperkv.cpu.int8_rows import load_rows_kernel  # noqa: E402
from whisperkv.cpu.plan import use_attention_kernels  # noqa: E402
from whisperkv.cpu.quantize import cpu_has_fast_bfloat16, quantize_int8  # noqa: E402
from whisperkv.load import model_from_checkpoint  # noqa: E402
from whisperkv.model.dims import KNOWN_DIMS, ModelDims  # noqa: E402
from whisperkv.model.random_weights import random_checkpoint  # noqa: E402

POSITIONS = 1500


def timed(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """(wall ms, CPU ms) medians per call, the calls interleaved round by round after a warm-up each."""
    for call in calls.values():
        call()
    wall: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            w, c = time.perf_counter(), time.process_time()
            call()
            wall[name].append((time.perf_counter() - w) * 1e3)
            cpu[name].append((time.process_time() - c) * 1e3)
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name])) for name in calls}


def linear_calls(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> dict[str, Callable[[], object]]:
    """One window's linear ``x @ w.T + b`` by every path this CPU has."""
    from torch.utils import mkldnn

    dense = torch.nn.Linear(w.shape[1], w.shape[0]).eval().requires_grad_(False)
    dense.weight.copy_(w), dense.bias.copy_(b)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onednn, xm = mkldnn.to_mkldnn(dense), x[0].to_mkldnn()
    xb, wb, bb = x.bfloat16(), w.bfloat16(), b.bfloat16()
    fbgemm = Int8Linear(w, b, None)
    calls = {
        "float32 PyTorch (MKL)": lambda: torch.nn.functional.linear(x, w, b),
        "float32 oneDNN": lambda: onednn(xm).to_dense(),
        "bfloat16 PyTorch (oneDNN)": lambda: torch.nn.functional.linear(xb, wb, bb),
        "int8 fbgemm (a window)": lambda: fbgemm(x),
    }
    kernel = load_rows_kernel()
    if kernel is not None:
        rows = Int8Linear(w, b, kernel)
        calls["int8 rows kernel"] = lambda: rows(x[0])
    return calls


def linears(width: int, repeats: int) -> None:
    g = torch.Generator().manual_seed(0)
    print(f"\none window's linear, {POSITIONS} positions; GFLOP/s per wall second and per CPU second")
    header = f"{'linear':>12} {'path':<26} {'wall ms':>8} {'CPU ms':>8} {'GF/s wall':>9} {'GF/s CPU':>9}"
    print(header + f" {'error':>9}")
    for k, n in ((width, 4 * width), (4 * width, width)):
        x = torch.randn(1, POSITIONS, k, generator=g)
        w, b = torch.randn(n, k, generator=g) * 0.02, torch.randn(n, generator=g) * 0.01
        calls = linear_calls(x, w, b)
        exact = torch.nn.functional.linear(x.double(), w.double(), b.double()).reshape(POSITIONS, n)
        flop = 2 * POSITIONS * k * n / 1e9
        for name, (wall, cpu) in timed(calls, repeats).items():
            error = (calls[name]().double().reshape(POSITIONS, n) - exact).abs().mean().item()
            print(
                f"{f'{k}->{n}':>12} {name:<26} {wall:8.1f} {cpu:8.1f} {flop / wall * 1e3:9.0f} "
                f"{flop / cpu * 1e3:9.0f} {error:9.1e}"
            )


def encoders(dims: ModelDims, repeats: int) -> None:
    if load_rows_kernel() is None:
        print("\nno int8 rows kernel here (no compiler, or neither AVX512-VNNI nor AVX2): no encoder table")
        return
    mel = torch.randn(1, dims.n_mels, 2 * POSITIONS, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = model_from_checkpoint(random_checkpoint(dims, 0)).embed_audio(mel)
        models = {}
        names = ("bfloat16", "int8 rows", "int8 rows twin", "int8")
        if not cpu_has_fast_bfloat16():  # PyTorch's bfloat16 without native products: ~50x float32's time
            print("\nno native bfloat16 products on this CPU: the bfloat16 encoder is left out")
            names = names[1:]
        for name in names:
            model = quantize_int8(model_from_checkpoint(random_checkpoint(dims, 0)), encoder=name[:9].strip())
            if name.endswith("twin"):
                use_attention_kernels(model, linears=False)
            models[name] = model
        times = timed({name: (lambda m=m: m.embed_audio(mel)) for name, m in models.items()}, repeats)
        print(f"\none window through {dims.n_audio_layer} encoder layers of width {dims.n_audio_state}")
        print(f"{'int8 type encoder':<18} {'wall ms':>8} {'CPU ms':>8} {'distance to float32 (mean)':>27}")
        for name, (wall, cpu) in times.items():
            distance = (models[name].embed_audio(mel) - exact).abs().mean() / exact.abs().mean()
            print(f"{name:<18} {wall:8.0f} {cpu:8.0f} {distance:26.1%}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="large-v3-turbo", choices=sorted(KNOWN_DIMS))
    p.add_argument("--layers", type=int, default=2, help="encoder layers in the encoder table")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(describe(args.threads))
    base = KNOWN_DIMS[args.size]
    linears(base.n_audio_state, args.repeats)
    dims = ModelDims(**{**base.to_dict(), "n_audio_layer": args.layers, "n_text_layer": 1})
    encoders(dims, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
