"""The bfloat16 encoder's self-attention through AVX512-BF16's dot product (``kernels/encoder_attend_dot.c``),
on CPUs that have it without AMX (AMD Zen 4 and 5).

Why: there the bfloat16 encoder attended head by head in PyTorch (``cpu/head_by_head.py``): two bfloat16
matrix products per head through a 1,500 x 1,500 score matrix written out and read back, and PyTorch's
softmax over it, about half of tiny.en's bfloat16 encoder. The kernel does what the AMX kernel
(``cpu/tiled_attention.py``) does with ``vdpbf16ps`` in place of tiles: each head's keys and values
packed once, scores of 4 queries at a time kept in the core's caches, the softmax in float32, the
probabilities rounded to bfloat16 times the values, the output written into [B, T, d]. Not SDPA's bits
nor head by head's: both are its twins, and all three are held to a float32 reference (tests).
"""

from __future__ import annotations

import ctypes

from whisperkv.cpu.flags import cpu_has_avx512_bf16
from whisperkv.cpu.tiled_attention import TiledEncoderAttention


class DotEncoderAttention(TiledEncoderAttention):
    """``attend`` for the bfloat16 encoder, taking what the tile kernel takes (``accepts``), where the
    kernels' library was built with AVX512-BF16."""

    SYMBOL, WHAT = "wkv_encoder_attend_dot", "the encoder's dot-product attention"

    @staticmethod
    def available(library: ctypes.CDLL) -> bool:
        """Whether this CPU has AVX512-BF16 and the library was built with it."""
        return cpu_has_avx512_bf16() and bool(library.wkv_encoder_attend_dot_available())
