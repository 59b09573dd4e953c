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

import torch

from whisperkv.cpu.flags import cpu_has_avx512_bf16
from whisperkv.cpu.tiled_attention import HEAD, TiledEncoderAttention


class DotEncoderAttention(TiledEncoderAttention):
    """``attend`` for the bfloat16 encoder, taking what the tile kernel takes (``accepts``), where the
    kernels' library was built with AVX512-BF16."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library
        self._fn = library.wkv_encoder_attend_dot
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 5 + [ctypes.c_float, ctypes.c_void_p]

    @staticmethod
    def available(library: ctypes.CDLL) -> bool:
        """Whether this CPU has AVX512-BF16 and the library was built with it."""
        return cpu_has_avx512_bf16() and bool(library.wkv_encoder_attend_dot_available())

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
                f"the encoder's dot-product attention failed (status {done}: not built, or no memory)"
            )
        return out


def _reload() -> DotEncoderAttention:
    from whisperkv.cpu.attend import load_kernel

    kernel = load_kernel()
    if kernel is None:
        raise RuntimeError("the C kernels could not be built in this process")
    return DotEncoderAttention(kernel.library)
