"""The int8 type's encoder self-attention in 16-bit integers (``kernels/encoder_attend_int16.c``), on CPUs
with AVX2 and FMA but no native bfloat16 products (AMD Zen 3, Intel before Cooper Lake).

Why: there the int8 type's encoder (fbgemm's linears, float32 between them) attended through PyTorch's
float32 SDPA, about half of tiny.en's window and a third of large-v3-turbo's (2-core Zen 3: 110-133
GFLOP/s; float32 FMAs peak ~200). AVX2 multiplies 16-bit integers in pairs (``vpmaddwd``) twice as
wide as float32 FMAs: queries and keys rounded to 13 bits per row, values to 12 bits per column and
each softmax row to 15-bit weights relative to its largest; the products exact integer sums, the
softmax float32 (the kernel's comment gives the bounds that keep the sums inside 32 bits). ~1.5x
SDPA's speed (``benchmarks/encoder_attention.py``); the float32 encoder's output moves ~4e-4 of its
size with it in place of SDPA (scratch, three clips). Not SDPA's bits: SDPA is its twin, and both are
held to a float64 reference (``tests/test_int16_attention.py``); the int8 type's words are measured
(``benchmarks/bench.py``).
"""

from __future__ import annotations

import ctypes

import torch

from whisperkv.cpu.tiled_attention import HEAD, TiledEncoderAttention


class Int16EncoderAttention(TiledEncoderAttention):
    """``attend`` for the int8 type's float32 encoder: the shapes and layout the tile kernel takes
    (``accepts``), in float32, where the kernels' library was built with AVX2 and FMA."""

    DTYPE = torch.float32

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library
        self._fn = library.wkv_encoder_attend_int16
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 5 + [ctypes.c_float, ctypes.c_void_p]

    @staticmethod
    def available(library: ctypes.CDLL) -> bool:
        """Whether the library was built with AVX2 and FMA (``-march=native`` on such a CPU)."""
        return bool(library.wkv_encoder_attend_int16_available())

    def __reduce__(self) -> tuple:
        return (_reload, ())  # another process loads (or builds) its own

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, t, d = q.shape
        out = q.new_empty(b, t, d)
        done = self._fn(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), q.stride(0), q.stride(1), b, k.shape[1], t,
            HEAD**-0.5, out.data_ptr(),
        )  # fmt: skip
        if done != 1:
            raise RuntimeError(
                f"the encoder's 16-bit attention failed (status {done}: not built, or no memory)"
            )
        return out


def _reload() -> Int16EncoderAttention:
    from whisperkv.cpu.attend import load_kernel

    kernel = load_kernel()
    if kernel is None:
        raise RuntimeError("the C kernels could not be built in this process")
    return Int16EncoderAttention(kernel.library)
