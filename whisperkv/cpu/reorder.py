"""A beam step's Self-KV reorder for every layer in one C call (``cpu/kernels/reorder.c``).

Why: after a beam step, each layer's keys and values follow the surviving beams' parents. Row by row
from Python (``SelfKV.reorder``, the twin) that is two tensor operations per moved row, per layer, for
keys and for values: 0.43 ms of a beam-5 step of tiny.en (round 15), 1.3 ms of a batched beam-5 step
over five windows (round 16, cProfile). Here one call makes the same copies (tested equal to the twin).
It applies where the twin would rewrite rows in place: the same row count, every layer's buffers of
one shape and contiguous; another row count (the prompt copied to every beam, finished windows dropped)
keeps the twin's fresh buffers.
"""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from whisperkv.cache.kv import SelfKV

_POINTER, _LONG = ctypes.c_void_p, ctypes.c_long


@functools.cache
def _kernel() -> ctypes._CFuncPtr | None:
    from whisperkv.cpu.attend import kernel_function  # the model's kernels library, built once

    arguments = [_POINTER, _LONG, _LONG, _LONG, _LONG, _LONG, _POINTER, _LONG, _POINTER]
    return kernel_function("wkv_reorder_rows", None, arguments)


def takes(self_kvs: list[SelfKV], rows: int) -> bool:
    """Whether one call can reorder these layers' Self-KVs for ``rows`` rows (else: the twin)."""
    if not self_kvs or _kernel() is None:
        return False
    first = self_kvs[0].buffers[0]
    return (
        all(
            buffer.shape == first.shape
            and buffer.dtype == first.dtype
            and buffer.is_contiguous()
            and buffer.device.type == "cpu"
            for kv in self_kvs
            for buffer in kv.buffers
        )
        and first.shape[0] == rows
        and all(kv.length == self_kvs[0].length for kv in self_kvs)
    )


def reorder_layers(self_kvs: list[SelfKV], moves: list[tuple[int, int]]) -> None:
    """Rows ``row`` of every layer's keys and values take what rows ``parent`` held, for each (row,
    parent) of ``moves`` (``kv.reorder_moves``), all parents read before any row is written. Call
    ``takes`` first."""
    if not moves:
        return
    function = _kernel()
    assert function is not None
    buffers = [buffer for kv in self_kvs for buffer in kv.buffers]
    first = buffers[0]
    _, heads, _, width = first.shape
    size = first.element_size()
    held = self_kvs[0].length * width * size  # bytes of a head's held positions (contiguous)
    pointers = (ctypes.c_void_p * len(buffers))(*[buffer.data_ptr() for buffer in buffers])
    pairs = torch.tensor(moves, dtype=torch.long)
    scratch = torch.empty(len(moves) * heads * held, dtype=torch.uint8)
    strides = (first.stride(0) * size, first.stride(1) * size)
    function(pointers, len(buffers), *strides, heads, held, pairs.data_ptr(), len(moves), scratch.data_ptr())
