"""``torch.topk`` of a step's log-probabilities, through a C kernel where it has a unique answer.

Why: beam search takes the beam size + 1 best tokens of every row each step. ``torch.topk`` copies
each 51,864-entry row into (value, index) pairs to sort them: 1.33 ms for batched beam 5's 40 rows, a
tenth of that step (scratch timing). ``kernels/top_k.c`` reads each row once, in blocks of 16 (see
``benchmarks/top_k.py``).

Exact, not approximate: where a row's k + 1 best values are all distinct, its top k (values, indices,
order) is the only one there is, so the kernel's equals ``torch.topk``'s. Where two are equal, the
order ``torch.topk`` gives among them is its own; the kernel flags that row and it goes through
``torch.topk`` here. Without a compiler (no kernel library) every row does.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from whisperkv.cpu.attend import kernel_function

MAX_K = 63  # MAXK - 1 in top_k.c


@functools.cache
def _kernel_fn() -> ctypes._CFuncPtr | None:
    return kernel_function(
        "wkv_top_k", ctypes.c_int, [ctypes.c_void_p] + [ctypes.c_long] * 4 + [ctypes.c_void_p] * 3
    )


def top_k(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k, dim=-1)`` for a [rows, n] float32 CPU tensor, the same values and indices."""
    fn = _kernel_fn()
    if (
        fn is None
        or x.dim() != 2
        or x.dtype != torch.float32
        or x.device.type != "cpu"
        or x.stride(-1) != 1
        or not 1 <= k <= min(MAX_K, x.shape[1])
    ):
        return x.topk(k, dim=-1)
    rows = x.shape[0]
    values = torch.empty(rows, k, dtype=torch.float32)
    indices = torch.empty(rows, k, dtype=torch.long)
    tied = torch.empty(rows, dtype=torch.int32)
    pointers = (values.data_ptr(), indices.data_ptr(), tied.data_ptr())
    if fn(x.data_ptr(), rows, x.shape[1], x.stride(0), k, *pointers):  # the checks above keep this away
        raise ValueError(f"the top-k kernel does not take k = {k}")
    if bool(tied.any()):  # equal values among a row's best: torch.topk's own order for those rows
        again = tied.nonzero().flatten()
        values[again], indices[again] = x[again].topk(k, dim=-1)
    return values, indices
