"""The bfloat16 type's decoder step in C: each linear with what is around it, a block in one call, the
whole step in one call.

Why: the same three layers the float32 and int8 types have (``cpu/step_rows.py``, ``cpu/block_step.py``,
``cpu/decoder_step.py``; ``cpu/int8_step.py``, ``cpu/int8_decoder_step.py``), each cutting the Python
between the kernels of the one below and giving its bits (tested with ``torch.equal``):

* ``Bf16StepRows``: one ``Bfloat16Linear`` with its LayerNorm (the kernels' own, ``rows_f32.c``), bias,
  GELU and residual in one C call (``wkv_bf16_rows_step``, ``kernels/bf16_rows.c``): the call-by-call
  path, the twin of the two below;
* ``Bf16BlockStep``: a lone cache's block in one call (``kernels/bf16_block_step.c``);
* ``Bf16DecoderStep``: a lone cache's whole step in one call: the embedding (the packed table's row,
  widened, plus the position's), every block, the final LayerNorm and the vocabulary.

Below them all, ``use_attention_kernels(model, rows=False)`` runs PyTorch's LayerNorm and GELU between
the linears' own calls, and a model converted without the rows kernel runs PyTorch throughout
(``Bfloat16Linear.reference``): the type's slower twins, with the same words (tested).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch
from torch import nn

from whisperkv.cpu.attend import HEAD, load_kernel
from whisperkv.cpu.bf16_linear import Bfloat16Embedding, Bfloat16Linear, load_bf16_rows_kernel
from whisperkv.cpu.block_step import BlockStep
from whisperkv.cpu.decoder_step import POSITIONS_AND_NORM_FIELDS, DecoderStep, positions_and_norm_take
from whisperkv.cpu.step_rows import call_rows, layer_norm_function, layer_norm_rows, rows_argtypes

if TYPE_CHECKING:
    from whisperkv.model.decoder import DecoderBlock, TextDecoder

_POINTER, _FLOAT, _LONG = ctypes.c_void_p, ctypes.c_float, ctypes.c_long
LANES = 16  # a LayerNorm's width must be a multiple of it (wkv_layer_norm)


class Bf16StepRows:
    """``y = epilogue(Bfloat16Linear(LayerNorm(x)))`` for float32 rows [n, in] in one C call."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._rows = library.wkv_bf16_rows_step
        self._rows.restype = ctypes.c_int
        self._rows.argtypes = rows_argtypes(weights=2)  # packed weights, bias
        self._norm = layer_norm_function(library)

    def __deepcopy__(self, memo: dict) -> Bf16StepRows:
        return self  # a loaded library: nothing in it to copy (ctypes handles cannot be)

    def __reduce__(self) -> tuple:
        return (load_bf16_step_rows, ())  # another process loads (or builds) its own

    @staticmethod
    def takes(layer: object) -> bool:
        """Whether ``layer`` is a ``Bfloat16Linear`` held for the rows kernel (``cpu/bf16_linear.py``)."""
        return (
            isinstance(layer, Bfloat16Linear) and layer.kernel is not None and layer.in_features % LANES == 0
        )

    def layer_norm(self, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        """``norm(x)`` as this kernel normalises the rows of a call with ``norm``: the same bits."""
        return layer_norm_rows(self._norm, x, norm)

    def through(
        self,
        x: torch.Tensor,
        layer: Bfloat16Linear,
        norm: nn.LayerNorm | None = None,
        gelu: bool = False,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Rows ``x`` [n, in] (float32, unit stride along a row) → [n, out]: ``norm`` first when given,
        then ``layer``'s bfloat16 product and bias, then GELU when ``gelu``, then ``+ residual``."""
        weights = (layer._packed.data_ptr(), layer._bias.data_ptr() if layer._bias is not None else None)
        what = "the bfloat16 step kernel"
        return call_rows(self._rows, x, weights, layer.out_features, norm, gelu, residual, what)


class Bf16Linear_(ctypes.Structure):  # noqa: N801 - the C struct's name, wkv_bf16_linear
    """``struct wkv_bf16_linear``: one ``Bfloat16Linear`` as the rows kernel holds it."""

    _fields_ = [("packed", _POINTER), ("bias", _POINTER)]


class Bf16BlockParameters(ctypes.Structure):
    """``struct wkv_bf16_block``: pointers to one block's LayerNorms and bfloat16 linears."""

    _fields_ = (
        [(name, _POINTER) for name in ("attn_ln_w", "attn_ln_b", "cross_ln_w", "cross_ln_b")]
        + [(name, _POINTER) for name in ("mlp_ln_w", "mlp_ln_b")]
        + [(name, _FLOAT) for name in ("attn_ln_eps", "cross_ln_eps", "mlp_ln_eps")]
        + [(name, Bf16Linear_) for name in ("qkv", "out", "query", "cross_out", "up", "down")]
        + [(name, _LONG) for name in ("d", "hidden", "heads")]
    )


class Bf16BlockStep(BlockStep):
    """``DecoderBlock``'s bfloat16 step through ``wkv_bf16_block_step``: bfloat16 caches."""

    FUNCTION = "wkv_bf16_block_step"
    CACHES = torch.bfloat16

    def __reduce__(self) -> tuple:
        return (load_bf16_block_step, ())

    def _make(self, block: DecoderBlock) -> tuple[ctypes.Structure | None, list[torch.Tensor]]:
        attn = block.attn
        norms = [block.attn_ln, block.cross_attn_ln, block.mlp_ln]
        layers = list(block.step_linears())
        d = attn.n_head * HEAD
        if not all(Bf16StepRows.takes(layer) for layer in layers) or layers[1].in_features != d:
            return None, []
        tensors = [t for norm in norms for t in (norm.weight, norm.bias)]
        if not all(t.dtype == torch.float32 and t.is_contiguous() and t.numel() == d for t in tensors):
            return None, []
        linears = []
        for layer in layers:
            tensors += [layer._packed] + ([layer._bias] if layer._bias is not None else [])
            bias = layer._bias.data_ptr() if layer._bias is not None else None
            linears.append(Bf16Linear_(layer._packed.data_ptr(), bias))
        made = Bf16BlockParameters(
            *[t.data_ptr() for t in tensors[:6]],
            *[norm.eps for norm in norms],
            *linears,
            d,
            layers[4].out_features,
            attn.n_head,
        )
        return made, tensors


class Bf16DecoderParameters(ctypes.Structure):
    """``struct wkv_bf16_decoder``: the blocks' structs, the packed table, the positions, the final
    LayerNorm."""

    _fields_ = [
        ("blocks", _POINTER),
        ("layers", _LONG),
        ("table", _POINTER),
        ("vocab", _LONG),
        *POSITIONS_AND_NORM_FIELDS,
    ]


class Bf16DecoderStep(DecoderStep):
    """``TextDecoder.forward_rows`` for one cache's rows of the bfloat16 type: bfloat16 caches."""

    FUNCTION = "wkv_bf16_decoder_step"
    BLOCK = Bf16BlockStep
    CACHES = torch.bfloat16

    def __reduce__(self) -> tuple:
        return (load_bf16_decoder_step, ())

    def _sources(self, decoder: TextDecoder) -> tuple | None:
        embedding, projection = decoder.token_embedding, decoder.logits_projection
        if not isinstance(embedding, Bfloat16Embedding) or embedding.projection is not projection:
            return None
        if not Bf16StepRows.takes(projection):
            return None
        return (projection._packed, decoder.positional_embedding, decoder.ln.weight, decoder.ln.bias)

    def _takes(self, decoder: TextDecoder, blocks: list) -> bool:
        """A bias-free vocabulary as wide as the blocks, its table the embedding's; float32 positions and
        final LayerNorm."""
        projection = decoder.logits_projection
        d = decoder.positional_embedding.shape[1]
        return (
            projection._bias is None
            and projection.in_features == d
            and positions_and_norm_take(decoder, blocks, d)
        )

    def _struct(self, decoder: TextDecoder, block_array: int, layers: int) -> tuple[ctypes.Structure, int]:
        projection, positions, ln = decoder.logits_projection, decoder.positional_embedding, decoder.ln
        struct = Bf16DecoderParameters(
            block_array,
            layers,
            projection._packed.data_ptr(),
            projection.out_features,
            positions.data_ptr(),
            positions.shape[0],
            ln.weight.data_ptr(),
            ln.bias.data_ptr(),
            ln.eps,
        )
        return struct, projection.out_features


def load_bf16_step_rows() -> Bf16StepRows | None:
    """The linears' kernel, where the bfloat16 rows kernel builds (AVX512-BF16); else None."""
    built = load_kernel() if load_bf16_rows_kernel() is not None else None
    return Bf16StepRows(built.library) if built is not None else None


def load_bf16_block_step() -> Bf16BlockStep | None:
    built = load_kernel() if load_bf16_rows_kernel() is not None else None
    return Bf16BlockStep(built.library) if built is not None else None


def load_bf16_decoder_step() -> Bf16DecoderStep | None:
    built = load_kernel() if load_bf16_rows_kernel() is not None else None
    return Bf16DecoderStep(built.library) if built is not None else None


def use_bf16_step(decoder: TextDecoder, on: bool = True) -> Bf16StepRows | None:
    """Route a bfloat16 decoder's steps through C (``on``, where the library builds and every linear of
    every block is held for the rows kernel) or through PyTorch between the linears (its slower twin).
    ``use_attention_kernels`` calls it; returns the linears' kernel in use, or None."""
    rows = load_bf16_step_rows() if on else None
    if rows is not None:
        for block in decoder.blocks:
            if not all(rows.takes(layer) for layer in block.step_linears()):
                rows = None
                break
    step = load_bf16_block_step() if rows is not None else None
    for block in decoder.blocks:
        block.step_rows, block.block_step = rows, step
    decoder.decoder_step = load_bf16_decoder_step() if step is not None else None
    return rows
