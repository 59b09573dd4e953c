"""A float32 decoder block's step for one cache's rows in one C call (``kernels/block_step.c``).

Why: through ``cpu/step_rows.py`` a step of tiny.en made 8 C calls per block from Python (six
linears, two attentions), and the Python around each call (an output allocated, a dozen pointers
passed, views taken, the new keys and values copied into the Self-KV) cost 5-10 µs: about 0.3 ms of a
3 ms step. ``kernels/block_step.c`` makes the same calls in the same order on the same inputs, so every
number is the call-by-call path's, bit for bit (the tests hold the two to ``torch.equal``); the Python
between them goes. It applies where the call-by-call path would run the kernels throughout: one
cache's rows (a lone window: greedy, or its beams; or the batched mode's windows, up to 16 rows a
window: since round 15), one new position each, the six linears held in
float16 (``step_rows.half_copy``: both bundled models), float32 caches. Anything else (a server's step over
several requests' caches, a prompt) keeps the call-by-call path, its twin.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import TYPE_CHECKING

import torch

from whisperkv.cpu.attend import HEAD, MAX_POSITIONS, MAX_ROWS, load_kernel

if TYPE_CHECKING:
    from whisperkv.cache.kv import CrossKV, SelfKV
    from whisperkv.model.decoder import DecoderBlock

_POINTER, _FLOAT, _LONG = ctypes.c_void_p, ctypes.c_float, ctypes.c_long


class BlockParameters(ctypes.Structure):
    """``struct wkv_block``: pointers to one block's LayerNorms, float16 weights and biases."""

    _fields_ = (
        [(name, _POINTER) for name in ("attn_ln_w", "attn_ln_b", "cross_ln_w", "cross_ln_b")]
        + [(name, _POINTER) for name in ("mlp_ln_w", "mlp_ln_b")]
        + [(name, _FLOAT) for name in ("attn_ln_eps", "cross_ln_eps", "mlp_ln_eps")]
        + [(f"{name}_w", _POINTER) for name in ("qkv", "out", "query", "cross_out", "up", "down")]
        + [(f"{name}_b", _POINTER) for name in ("qkv", "out", "query", "cross_out", "up", "down")]
        + [(name, _LONG) for name in ("d", "hidden", "heads")]
    )


def _tensors(block: DecoderBlock) -> tuple[list[torch.Tensor], list[torch.Tensor], list[float]]:
    """(LayerNorm weights and biases, linear weights then biases, LayerNorm eps) in the struct's order."""
    norms = [block.attn_ln, block.cross_attn_ln, block.mlp_ln]
    layers = list(block.step_linears())
    return (
        [t for norm in norms for t in (norm.weight, norm.bias)],
        [layer.weight for layer in layers] + [layer.bias for layer in layers],
        [norm.eps for norm in norms],
    )


class BlockStep:
    """``DecoderBlock``'s step through ``wkv_block_step`` where it ``takes`` the rows.

    The int8 type's (``cpu/int8_step.py``) is this class with another C function, struct and cache
    dtype: ``FUNCTION``, ``CACHES`` and ``_make``."""

    #: the C function: (struct, rows, Self-KV and its strides, Cross-KV and its strides, work, scale)
    FUNCTION = "wkv_block_step"
    #: the dtype of the caches it reads and writes
    CACHES = torch.float32

    def __init__(self, library: ctypes.CDLL) -> None:
        argtypes = [_POINTER, _POINTER, _LONG, _POINTER, _POINTER]
        argtypes += [_LONG] * 4 + [_POINTER, _POINTER] + [_LONG] * 5 + [_POINTER, _FLOAT]
        self._step = getattr(library, self.FUNCTION)
        self._step.restype, self._step.argtypes = ctypes.c_int, argtypes
        #: per block (by id): a weak reference to it, its struct (None: not the kernel's), and the tensors
        #: the struct points into, held so that no pointer outlives its memory. Made on a block's first
        #: step (27 µs: too slow to check every step); ``DecoderBlock._apply`` (``.to()``, ``.float()``)
        #: forgets it, and ``use_block_step`` starts afresh after weights are replaced.
        self._prepared: dict[int, tuple[weakref.ref, ctypes.Structure | None, list[torch.Tensor]]] = {}

    def __deepcopy__(self, memo: dict) -> BlockStep:
        return self  # a loaded library: nothing in it to copy (ctypes handles cannot be)

    def __reduce__(self) -> tuple:
        return (load_block_step, ())  # another process loads (or builds) its own

    def parameters(self, block: DecoderBlock) -> ctypes.Structure | None:
        """The block's struct, or None where a linear is not held in float16 (or a shape is not the
        kernel's): then the block steps call by call. Made once per block: after replacing a block's
        weights by hand, call ``use_block_step`` again."""
        held = self._prepared.get(id(block))
        if held is not None and held[0]() is block:
            return held[1]
        made, tensors = self._make(block)
        self._prepared[id(block)] = (weakref.ref(block), made, tensors)
        return made

    def _make(self, block: DecoderBlock) -> tuple[ctypes.Structure | None, list[torch.Tensor]]:
        """The block's struct (or None), and the tensors it points into."""
        norms, linears, eps = _tensors(block)
        return _make_parameters(block, norms, linears, eps), norms + linears

    def forget(self, block: DecoderBlock) -> None:
        """Drop the block's struct: its tensors moved (``DecoderBlock._apply``)."""
        self._prepared.pop(id(block), None)

    def takes(
        self, block: DecoderBlock, x: torch.Tensor, sizes: list[int], self_kv: SelfKV, cross_kv: CrossKV
    ) -> bool:
        """Whether ``x`` [n, 1, d] is one cache's rows that this call computes as the call-by-call path."""
        n = x.shape[0]
        # any number of rows: the attention kernel's limit is per window (beams of one window's Cross-KV)
        if len(sizes) != 1 or x.dim() != 3 or x.shape[1] != 1 or x.dtype != torch.float32:
            return False
        parameters = self.parameters(block)
        if parameters is None or x.shape[2] != parameters.d:
            return False
        key, value = self_kv.buffers
        cross_key, cross_value = cross_kv.key, cross_kv.value
        return (
            key.dtype == value.dtype == cross_key.dtype == cross_value.dtype == self.CACHES
            and key.shape[1] == cross_key.shape[1] == parameters.heads
            and key.shape[0] == n
            and key.shape[-1] == HEAD
            and cross_key.shape[-1] == HEAD
            and self_kv.length < self_kv.capacity
            and 1 <= cross_key.shape[2] <= MAX_POSITIONS
            and n % cross_key.shape[0] == 0
            and n // cross_key.shape[0] <= MAX_ROWS
            and key.stride() == value.stride()
            and key.stride(-1) == 1
            and cross_key.stride() == cross_value.stride()
            and cross_key.stride(-1) == 1
        )

    def __call__(
        self, block: DecoderBlock, x: torch.Tensor, self_kv: SelfKV, cross_kv: CrossKV
    ) -> torch.Tensor:
        """The block's output [n, 1, d] for rows ``x`` (call ``takes`` first); the Self-KV grows by one."""
        parameters = self.parameters(block)
        n, _, d = x.shape
        out = x.reshape(n, d).clone()  # written in place by the kernel; the caller's rows stay as they were
        work = torch.empty(n * (6 * d + parameters.hidden))
        key, value = self_kv.buffers
        cross_key, cross_value = cross_kv.key, cross_kv.value
        failed = self._step(
            ctypes.byref(parameters),
            out.data_ptr(),
            n,
            key.data_ptr(),
            value.data_ptr(),
            self_kv.length,
            *key.stride()[:3],
            cross_key.data_ptr(),
            cross_value.data_ptr(),
            cross_key.shape[0],
            cross_key.shape[2],
            *cross_key.stride()[:3],
            work.data_ptr(),
            HEAD**-0.5,
        )
        if failed:  # ``takes`` keeps this from happening
            raise ValueError(f"the block step kernel does not take {tuple(x.shape)}")
        self_kv.grow(1)
        return out.view(n, 1, d)


def _make_parameters(
    block: DecoderBlock, norms: list[torch.Tensor], linears: list[torch.Tensor], eps: list[float]
) -> BlockParameters | None:
    weights, biases = linears[:6], linears[6:]
    d = block.attn.query.weight.shape[1]
    if not all(w.dtype == torch.float16 and w.is_contiguous() for w in weights):
        return None
    if not all(t.dtype == torch.float32 and t.is_contiguous() for t in norms + biases):
        return None
    if d % 16 or d != block.attn.n_head * HEAD:  # LANES in rows_f32.c; the kernel's head width
        return None
    hidden = weights[4].shape[0]
    return BlockParameters(
        *[t.data_ptr() for t in norms],
        *eps,
        *[t.data_ptr() for t in weights + biases],
        d,
        hidden,
        block.attn.n_head,
    )


def load_block_step() -> BlockStep | None:
    """The kernel, from the library ``load_kernel`` builds; None where it cannot be built."""
    built = load_kernel()
    return BlockStep(built.library) if built is not None else None


def use_block_step(decoder: torch.nn.Module, on: bool = True) -> BlockStep | None:
    """Give a decoder's blocks the one-call step (``on``, where the library builds) or not (the
    call-by-call path, its twin). ``use_step_rows`` calls it; returns the kernel in use, or None."""
    step = load_block_step() if on else None
    for block in decoder.blocks:
        block.block_step = step
    return step
