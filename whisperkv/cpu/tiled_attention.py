"""The int8 type's bfloat16 encoder self-attention in AMX's bfloat16 tiles (``kernels/encoder_attend.c``).

Why: a window's self-attention (1,500 x 1,500 scores a head) was 40 % of the int8 type's encoder through
SDPA's bfloat16 path (~10 ms a layer for tiny.en), and the encoder is most of a served short clip's time.
The C kernel packs each head's keys and values once, then threads take 128 queries of a head at a time:
scores in tiles, the softmax over each whole row in float32, the probabilities rounded to bfloat16 (as
SDPA's bfloat16 path does) times the values in tiles, each window's output written straight into [B, T, d]
(no transpose). A window's numbers depend on
nothing else in the batch, nor on the thread count. Not SDPA's bits: its slow twin is SDPA, and both are
held to a float32 reference (tests); the int8 type's words are measured (``benchmarks/bench.py``).
"""

from __future__ import annotations

import ctypes

import torch

HEAD = 64  # every Whisper model's head width


class TiledEncoderAttention:
    """``attend`` for the bfloat16 encoder (queries [B, T, d], keys/values [B, H, T, 64] views of one row
    layout, no mask), where the kernels' library was built with AMX and Linux lends the tiles."""

    #: what its queries, keys, values and output hold
    DTYPE = torch.bfloat16
    #: the library's function (the same arguments for every encoder attention kernel), and its name in errors
    SYMBOL, WHAT = "wkv_encoder_attend_bf16", "the tiled encoder attention"

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library
        self._fn = getattr(library, self.SYMBOL)
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 5 + [ctypes.c_float, ctypes.c_void_p]

    @staticmethod
    def available(library: ctypes.CDLL) -> bool:
        """Whether this library has the tile path (built with AMX) and this process may use the tiles."""
        return bool(library.wkv_encoder_attend_available())

    def __deepcopy__(self, memo: dict) -> TiledEncoderAttention:
        return self  # a loaded library: nothing in it to copy (ctypes handles cannot be)

    def __reduce__(self) -> tuple:
        return (_reload, (type(self),))  # another process loads (or builds) its own

    def accepts(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_offset: int | None) -> bool:
        """Unmasked self-attention (``DTYPE``) whose queries, keys and values share one layout: position t of
        window w, head h at w * window_stride + t * stride + h * 64 (the fused projection's three views,
        or three tensors laid out alike)."""
        if causal_offset is not None or not q.dtype == k.dtype == v.dtype == self.DTYPE:
            return False
        if q.dim() != 3 or k.dim() != 4 or k.shape != v.shape or k.shape[3] != HEAD:
            return False
        b, t, d = q.shape
        if k.shape[0] != b or k.shape[2] != t or k.shape[1] * HEAD != d or t < 2:
            return False
        layout = (q.stride(0), q.stride(1), HEAD, 1)
        return (
            q.stride(2) == 1
            and (k.stride(0), k.stride(2), k.stride(1), k.stride(3)) == layout
            and (v.stride(0), v.stride(2), v.stride(1), v.stride(3)) == layout
        )

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, t, d = q.shape
        out = q.new_empty(b, t, d)
        done = self._fn(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), q.stride(0), q.stride(1), b, k.shape[1], t,
            HEAD**-0.5, out.data_ptr(),
        )  # fmt: skip
        if done != 1:
            raise RuntimeError(f"{self.WHAT} failed (status {done}: not built here, or no memory)")
        return out


def _reload(kind: type[TiledEncoderAttention] = TiledEncoderAttention) -> TiledEncoderAttention:
    from whisperkv.cpu.attend import load_kernel

    kernel = load_kernel()
    if kernel is None:
        raise RuntimeError("the C kernels could not be built in this process")
    return kind(kernel.library)
