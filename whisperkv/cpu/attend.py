"""Decoder steps' attention: a small C kernel (``kernels/attend.c``), and which attention a model runs.

Why: a decoder step attends 1-16 new rows per window (one per beam) over up to 1,500 cached positions.
``scaled_dot_product_attention`` runs that through a blocked flash kernel made for long queries; the
kernel here makes one pass over each head's keys and one over its values for all the window's rows.
``benchmarks/attend_kernel.py`` on this project's 2-core VM (tiny.en shapes, caches not in the CPU
cache): one query over a window's Cross-KV 180 µs against 244, five queries (beam 5) 254 against 478,
five windows of five beams (batched mode) 1,121 against 2,353.

Both CPU compute types use it (``use_attention_kernels``, below): the int8 type since round 6, float32
since round 9. Its sums run in another order than SDPA's, so its outputs differ in the last bits
(2-5e-7), as the float32 row GEMMs' do (``cpu/row_gemm.py``): float32 transcripts stay the
reference's token for token (parity tests, ``verify``, and SDPA kept as the kernel's slow twin in the
tests). Measured in one process, interleaved, tiny.en float32 on 120 s of utterances (scratch): greedy
4.08 against 4.29 s, beam 5 6.31 against 7.21 s, the same tokens; base 7.42 / 7.78 and 10.40 / 10.93.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from whisperkv.cpu.build import load_library

HEAD = 64  # every Whisper model's head width
MAX_ROWS = 16  # query rows per window the kernel takes (MAXQ in attend.c)
MAX_POSITIONS = 1500  # cached positions it attends over (MAXT): the audio context, the text one is 448


class AttendKernel:
    """``attend`` for one new position per row, head width 64, float32 queries over float32 or bfloat16
    caches: the C kernel, or not at all."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self.library = library  # also holds the int8 linears' kernel (``cpu/int8_rows.py``)
        #: the version for each dtype the caches may be held in (queries and output stay float32)
        self._fns = {torch.float32: library.wkv_attend, torch.bfloat16: library.wkv_attend_bf16}
        for fn in self._fns.values():
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_long] + [ctypes.c_void_p] * 3 + [ctypes.c_long] * 10
            fn.argtypes += [ctypes.c_float]

    def __deepcopy__(self, memo: dict) -> AttendKernel:
        return self  # a loaded library: nothing in it to copy (ctypes handles cannot be)

    def __reduce__(self) -> tuple:
        return (load_kernel, ())  # another process loads (or builds) its own

    def accepts(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_offset: int | None) -> bool:
        """Whether ``q`` [B, 1, d] (float32) over ``k``/``v`` [Bk, H, T, 64] (float32 or bfloat16) is a
        step this kernel computes.

        One query position per row needs no mask: a new position sees every key held, its own included.
        Beams share their window's keys (B a multiple of Bk) only where there is no mask (cross-attention).
        """
        if q.dim() != 3 or q.shape[1] != 1 or k.dim() != 4 or k.shape[-1] != HEAD:
            return False
        if not 1 <= k.shape[2] <= MAX_POSITIONS:
            return False
        if q.dtype != torch.float32 or k.dtype not in self._fns or v.dtype != k.dtype:
            return False
        if q.device.type != "cpu" or k.device.type != "cpu" or v.device.type != "cpu":
            return False
        b, bk = q.shape[0], k.shape[0]
        if b % bk or not 1 <= b // bk <= MAX_ROWS or (causal_offset is not None and b != bk):
            return False
        return q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1 and v.shape == k.shape

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Softmax(q kᵀ / 8) v per head: [B, 1, d] like ``attention.attend`` (call ``accepts`` first)."""
        bk, n_head, positions, _ = k.shape
        out = torch.empty(q.shape[0], 1, q.shape[2], dtype=torch.float32)
        failed = self._fns[k.dtype](
            q.data_ptr(),
            q.stride(0),
            k.data_ptr(),
            v.data_ptr(),
            out.data_ptr(),
            bk,
            q.shape[0] // bk,
            n_head,
            positions,
            *k.stride()[:3],
            *v.stride()[:3],
            HEAD**-0.5,
        )
        if failed:  # ``accepts`` keeps this from happening
            raise ValueError(f"the attention kernel does not take {tuple(q.shape)} over {tuple(k.shape)}")
        return out


@functools.cache
def load_kernel(directory: Path | None = None) -> AttendKernel | None:
    """The step attention from the kernels' library (``cpu/build.py``), or None where it is not built:
    the caller then keeps SDPA."""
    built = load_library(directory)
    return None if built is None else AttendKernel(built.library, built.path)


def kernel_function(name: str, restype: object, argtypes: list) -> ctypes._CFuncPtr | None:
    """One function of the kernels' library with its C signature set, or None where the library is not
    built (the caller's twin runs). Callers cache it (``functools.cache``)."""
    built = load_kernel()
    if built is None:
        return None
    function = getattr(built.library, name)
    function.restype, function.argtypes = restype, argtypes
    return function
