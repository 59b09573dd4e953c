"""The int8 type's encoder self-attention in 16-bit integers (``kernels/encoder_attend_int16.c``), on CPUs
with AVX2 and FMA but no native bfloat16 products (AMD Zen 3, Intel before Cooper Lake).

Why: there the int8 type's encoder (fbgemm's linears, float32 between them) attended through PyTorch's
float32 SDPA, about half of tiny.en's window and a third of large-v3-turbo's (2-core Zen 3: 110-133
GFLOP/s; float32 FMAs peak ~200). AVX2 multiplies 16-bit integers in pairs (``vpmaddwd``) twice as
wide as float32 FMAs: queries and keys rounded to 13 bits per row, values to 12 bits per column and
each softmax row to 15-bit weights relative to its largest; the products exact integer sums, the
softmax float32 (the kernel's comment gives the bounds that keep the sums inside 32 bits). 1.58x
SDPA's speed on the Zen 3, and tiny.en's float32 encoder's output moves 3.7-4.4e-4 of its size with it
in place of SDPA on four clips (``benchmarks/encoder_attention.py``). Not SDPA's bits: SDPA is its
twin, and both are held to a float64 reference (``tests/test_int16_attention.py``); the int8 type's
words are measured (``benchmarks/int8_variants.py``, ``benchmarks/bench.py``).
"""

from __future__ import annotations

import ctypes

import torch

from whisperkv.cpu.tiled_attention import TiledEncoderAttention


class Int16EncoderAttention(TiledEncoderAttention):
    """``attend`` for the int8 type's float32 encoder: the shapes and layout the tile kernel takes
    (``accepts``), in float32, where the kernels' library was built with AVX2 and FMA."""

    DTYPE = torch.float32
    SYMBOL, WHAT = "wkv_encoder_attend_int16", "the encoder's 16-bit attention"

    @staticmethod
    def available(library: ctypes.CDLL) -> bool:
        """Whether the library was built with AVX2 and FMA (``-march=native`` on such a CPU)."""
        return bool(library.wkv_encoder_attend_int16_available())
