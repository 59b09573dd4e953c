"""A float32 decoder step of one cache in one C call: embedding, every block, final LayerNorm, vocabulary.

Why: with every block's step in one C call (``cpu/block_step.py``), a step of tiny.en still went
through Python between those calls: the embedding, four ``BlockStep.takes`` checks, four clones and
work buffers, four ctypes calls of 18 arguments, the final LayerNorm and the projection's own call.
Each is a few µs in a hot loop, but inside a step that has just read 75 MB of weights and caches they
cost tens (scratch, round 20: about 0.7 ms of a 3.7 ms step). ``wkv_decoder_step``
(``kernels/block_step.c``) makes the same C calls in the same order on the same inputs, so every logit
is the call-by-call path's, bit for bit (tests hold the two to ``torch.equal``); what is left in Python
is one check that the cache's tensors are the ones last seen, one call and the bookkeeping (the
Self-KV's length, the recorded tokens).

It applies where the call-by-call path runs the kernels throughout: one cache's rows (greedy, a
window's beams, or the batched mode's windows) at one new position, every block's ``BlockStep``
struct made (float16-held linears, float32 caches), the tied table held in float16 and read by the
projection's kernel. Anything else returns None and the caller steps call by call: its twin.
"""

from __future__ import annotations

import ctypes
import operator
import weakref
from typing import TYPE_CHECKING

import torch

from whisperkv.cpu.attend import HEAD, MAX_POSITIONS, MAX_ROWS, load_kernel
from whisperkv.cpu.block_step import BlockStep
from whisperkv.cpu.vocab import ChunkedRowProjection

if TYPE_CHECKING:
    from whisperkv.cache.kv import DecoderCache
    from whisperkv.model.decoder import TextDecoder

_POINTER, _FLOAT, _LONG = ctypes.c_void_p, ctypes.c_float, ctypes.c_long

#: the run both types' decoder structs hold after their token tables, in this order: the positions and
#: the final LayerNorm (what ``positions_and_norm_take`` checks)
POSITIONS_AND_NORM_FIELDS = [
    ("positions", _POINTER),
    ("n_ctx", _LONG),
    ("ln_w", _POINTER),
    ("ln_b", _POINTER),
    ("ln_eps", _FLOAT),
]


class DecoderParameters(ctypes.Structure):
    """``struct wkv_decoder``: the blocks' structs, the tied table, the positions, the final LayerNorm."""

    _fields_ = [
        ("blocks", _POINTER),
        ("layers", _LONG),
        ("table", _POINTER),
        ("vocab", _LONG),
        *POSITIONS_AND_NORM_FIELDS,
    ]


class _ModelPlan:
    """A decoder's struct and the objects it was made from (checked by identity every step)."""

    def __init__(self, decoder: TextDecoder, blocks: list, sources: tuple, step: DecoderStep) -> None:
        self.decoder = weakref.ref(decoder)
        self.sources = (*blocks, *sources)
        self.block_array = (_POINTER * len(blocks))(*[ctypes.addressof(b) for b in blocks])
        self.struct, self.vocab = step._struct(decoder, ctypes.addressof(self.block_array), len(blocks))
        self.d = decoder.positional_embedding.shape[1]
        self.work_width = max(6 * b.d + b.hidden for b in blocks)


class _CachePlan:
    """One cache's tensors, as pointer arrays per layer, and the shapes and strides every layer shares."""

    def __init__(self, tensors: tuple[torch.Tensor, ...], layers: int) -> None:
        #: held weakly: a finished window's caches (tens of MB) must not outlive it in a plan
        self.tensors = [weakref.ref(t) for t in tensors]
        keys, values = tensors[0 : 4 * layers : 4], tensors[1 : 4 * layers : 4]
        cross_keys, cross_values = tensors[2 : 4 * layers : 4], tensors[3 : 4 * layers : 4]
        groups = (keys, values, cross_keys, cross_values)
        self.arrays = [(_POINTER * layers)(*[t.data_ptr() for t in group]) for group in groups]
        self.self_strides = keys[0].stride()[:3]
        self.cross_rows, self.cross_positions = cross_keys[0].shape[0], cross_keys[0].shape[2]
        self.cross_strides = cross_keys[0].stride()[:3]
        self._scratch: tuple[tuple[int, int, int], torch.Tensor, torch.Tensor] | None = None

    def scratch(self, rows: int, d: int, work_width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's hidden rows [rows, d] and work [rows * work_width]: written whole by every step and
        never handed out, so made once for the cache (two ``torch.empty`` a step were ~10-20 us of a
        tiny.en step in a transcription, run where the step's weights had just gone through the caches)."""
        if self._scratch is None or self._scratch[0] != (rows, d, work_width):
            self._scratch = ((rows, d, work_width), torch.empty(rows, d), torch.empty(rows * work_width))
        return self._scratch[1], self._scratch[2]


def _cache_tensors(cache: DecoderCache) -> tuple[torch.Tensor, ...]:
    """Every layer's (Self-KV key, value, Cross-KV key, value) buffers, layer by layer."""
    out: list[torch.Tensor] = []
    for self_kv, cross_kv in zip(cache.self_kv, cache.cross_kv, strict=True):
        out += (*self_kv.buffers, cross_kv.key, cross_kv.value)
    return tuple(out)


def _cache_takes(
    tensors: tuple[torch.Tensor, ...], layers: int, rows: int, heads: int, dtype: torch.dtype
) -> bool:
    """Whether every layer's caches are ``dtype`` of one shape and stride, as the attention kernel reads
    them for ``rows`` query rows (the conditions of ``BlockStep.takes``, for every layer at once)."""
    if len(tensors) != 4 * layers:
        return False
    key, cross_key = tensors[0], tensors[2]
    for i in range(0, len(tensors), 4):
        k, v, ck, cv = tensors[i : i + 4]
        if not (k.shape == v.shape == key.shape and k.stride() == v.stride() == key.stride()):
            return False
        if not (ck.shape == cv.shape == cross_key.shape and ck.stride() == cv.stride() == cross_key.stride()):
            return False
        for t in (k, v, ck, cv):
            if t.dtype != dtype or t.device.type != "cpu" or t.stride(-1) != 1:
                return False
    return (
        key.dim() == cross_key.dim() == 4
        and key.shape[0] == rows
        and key.shape[1] == cross_key.shape[1] == heads
        and key.shape[-1] == cross_key.shape[-1] == HEAD
        and 1 <= cross_key.shape[2] <= MAX_POSITIONS
        and rows % cross_key.shape[0] == 0
        and rows // cross_key.shape[0] <= MAX_ROWS
    )


class DecoderStep:
    """``TextDecoder.forward_rows`` for one cache's rows through ``wkv_decoder_step`` where it takes them.

    The int8 type's (``cpu/int8_decoder_step.py``) is this class with another C function, block step,
    cache dtype and struct: ``FUNCTION``, ``BLOCK``, ``CACHES``, ``_sources`` and ``_struct``."""

    #: the C function: (struct, tokens, rows, position, Self-KVs and strides, Cross-KVs and strides, x,
    #: work, logits, scale)
    FUNCTION = "wkv_decoder_step"
    #: the blocks' one-call step it runs (exactly this class: not a subclass's)
    BLOCK: type[BlockStep] = BlockStep
    #: the dtype of the caches it reads and writes
    CACHES = torch.float32

    def __init__(self, library: ctypes.CDLL) -> None:
        self._step = getattr(library, self.FUNCTION)
        self._step.restype = ctypes.c_int
        self._step.argtypes = (
            [_POINTER, _POINTER, _LONG, _LONG, _POINTER, _POINTER]
            + [_LONG] * 4
            + [_POINTER, _POINTER]
            + [_LONG] * 5
            + [_POINTER, _POINTER, _POINTER, _FLOAT]
        )
        self._model: _ModelPlan | None = None
        #: the last cache stepped (held weakly) and its plan: a window's steps all use one cache
        self._cache: tuple[weakref.ref, _CachePlan] | None = None

    def __deepcopy__(self, memo: dict) -> DecoderStep:
        return self  # a loaded library; its plans check by identity which model and cache they are of

    def __reduce__(self) -> tuple:
        return (load_decoder_step, ())  # another process loads (or builds) its own

    def _model_plan(self, decoder: TextDecoder) -> _ModelPlan | None:
        """The decoder's struct, remade whenever a block's struct or a tensor it points into changed."""
        blocks = []
        for block in decoder.blocks:
            step = block.block_step
            made = step.parameters(block) if type(step) is self.BLOCK else None
            if made is None:
                return None
            blocks.append(made)
        sources = self._sources(decoder)
        if sources is None:
            return None
        plan = self._model
        now = (*blocks, *sources)
        if plan is not None and plan.decoder() is decoder and all(map(operator.is_, now, plan.sources)):
            return plan
        if not self._takes(decoder, blocks):
            return None
        self._model = _ModelPlan(decoder, blocks, sources, self)
        return self._model

    def _sources(self, decoder: TextDecoder) -> tuple | None:
        """The objects the struct is made from beside the blocks' (compared by identity every step), or
        None where the decoder has none of this type's."""
        table = getattr(decoder.token_embedding, "weight", None)  # the int8 type's table has none
        if table is None:
            return None
        return (table, decoder.positional_embedding, decoder.ln.weight, decoder.ln.bias)

    def _takes(self, decoder: TextDecoder, blocks: list) -> bool:
        return _model_takes(decoder, blocks)

    def _struct(self, decoder: TextDecoder, block_array: int, layers: int) -> tuple[ctypes.Structure, int]:
        """The C struct for the decoder (its blocks' structs at ``block_array``) and its vocabulary size."""
        table, positions, ln = decoder.token_embedding.weight, decoder.positional_embedding, decoder.ln
        struct = DecoderParameters(
            block_array,
            layers,
            table.data_ptr(),
            table.shape[0],
            positions.data_ptr(),
            positions.shape[0],
            ln.weight.data_ptr(),
            ln.bias.data_ptr(),
            ln.eps,
        )
        return struct, table.shape[0]

    def logits(self, decoder: TextDecoder, tokens: torch.Tensor, cache: DecoderCache) -> torch.Tensor | None:
        """Logits [n, vocab] of the next position for ``tokens`` [n, 1], one per row of ``cache``, which
        grows by that position; or None where this call does not compute what the call-by-call path
        would (nothing is changed then)."""
        if tokens.dim() != 2 or tokens.shape[1] != 1 or tokens.dtype != torch.long:
            return None
        if not tokens.is_cpu:
            return None
        plan = self._model_plan(decoder)
        if plan is None:
            return None
        layers, n = len(decoder.blocks), tokens.shape[0]
        length = cache.self_kv[0].length if cache.self_kv else -1
        if any(kv.length != length for kv in cache.self_kv) or not 0 <= length < cache.self_kv[0].capacity:
            return None
        held = self._cache_plan(cache, layers, n, decoder.blocks[0].attn.n_head)
        if held is None:
            return None
        ids = tokens if n == 1 else tokens.reshape(n).contiguous()  # one id: wherever its row is
        x, work = held.scratch(n, plan.d, plan.work_width)
        logits = torch.empty(n, plan.vocab)  # the caller's: filters edit it in place
        failed = self._step(
            ctypes.byref(plan.struct),
            ids.data_ptr(),
            n,
            length,
            *held.arrays[:2],
            length,
            *held.self_strides,
            *held.arrays[2:],
            held.cross_rows,
            held.cross_positions,
            *held.cross_strides,
            x.data_ptr(),
            work.data_ptr(),
            logits.data_ptr(),
            HEAD**-0.5,
        )
        if failed == 2:  # the text context is full: the error the call-by-call path raises
            raise ValueError(f"text context is {decoder.n_ctx} tokens; position {length} is past it")
        if failed == 3:
            raise ValueError(f"a token id is outside the vocabulary of {plan.vocab}: {ids.tolist()}")
        if failed:  # the checks above keep this from happening
            raise ValueError(f"the decoder step kernel does not take {n} rows (code {failed})")
        for kv in cache.self_kv:  # every layer one shape (``_cache_takes``), ``length`` below its capacity
            kv.length = length + 1  # (checked above): the position the kernel wrote, counted
        cache.record_tokens(tokens)
        return logits

    def _cache_plan(self, cache: DecoderCache, layers: int, rows: int, heads: int) -> _CachePlan | None:
        """The cache's plan: the last one if its tensors are the same objects, else checked and made."""
        tensors = _cache_tensors(cache)
        if self._cache is not None:
            owner, plan = self._cache
            same = len(tensors) == len(plan.tensors) and all(
                t is held() for t, held in zip(tensors, plan.tensors)
            )
            if owner() is cache and same:
                return plan if tensors[0].shape[0] == rows else None
        if not _cache_takes(tensors, layers, rows, heads, self.CACHES):
            return None
        plan = _CachePlan(tensors, layers)
        self._cache = (weakref.ref(cache), plan)
        return plan


def _model_takes(decoder: TextDecoder, blocks: list[ctypes.Structure]) -> bool:
    """Whether the decoder's table, positions and final LayerNorm are what the C step reads: a float16
    table that the projection's kernel multiplies (``step_rows.use_step_rows``), float32 positions and
    LayerNorm, one width throughout."""
    table, projection = decoder.token_embedding.weight, decoder.logits_projection
    d = table.shape[1] if table.dim() == 2 else -1
    return (
        isinstance(projection, ChunkedRowProjection)
        and projection.kernel is not None
        and projection.weight.data_ptr() == table.data_ptr()
        and projection.weight.shape == table.shape
        and table.dtype == torch.float16
        and table.is_contiguous()
        and table.device.type == "cpu"
        and positions_and_norm_take(decoder, blocks, d)
    )


def positions_and_norm_take(decoder: TextDecoder, blocks: list[ctypes.Structure], d: int) -> bool:
    """What both types' C steps read beside their tables: float32 positions [n_ctx, d] and final
    LayerNorm [d], contiguous, and every block ``d`` wide."""
    positions, ln = decoder.positional_embedding, decoder.ln
    return (
        positions.dtype == ln.weight.dtype == ln.bias.dtype == torch.float32
        and positions.is_contiguous()
        and positions.shape[1] == d
        and ln.weight.is_contiguous()
        and ln.bias.is_contiguous()
        and ln.weight.shape == (d,)
        and all(b.d == d for b in blocks)
    )


def load_decoder_step() -> DecoderStep | None:
    """The kernel, from the library ``load_kernel`` builds; None where it cannot be built."""
    built = load_kernel()
    return DecoderStep(built.library) if built is not None else None
