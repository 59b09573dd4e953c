"""The int8 type's decoder step of one cache in one C call (``wkv_int8_decoder_step``).

Why: as for float32 (``cpu/decoder_step.py``), the int8 type's step went block by block from Python
(``cpu/int8_step.py``: each block one C call), with the embedding, the final LayerNorm and the
vocabulary's own call around them. Here the embedding (int8 rows × their scales, plus the position's
row: PyTorch's two roundings, in its order), every block's step and the vocabulary with its LayerNorm
(``wkv_int8_rows_step``, as ``TextDecoder._logits`` calls it) are one call: the same calls, the same
bits (tested with ``torch.equal``). Where it does not apply (a model stepping through PyTorch, several
caches in one step) the steps go block by block: its twin.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch

from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.decoder_step import POSITIONS_AND_NORM_FIELDS, DecoderStep, positions_and_norm_take
from whisperkv.cpu.int8_step import (
    Int8BlockStep,
    Int8Linear_,
    Int8StepRows,
    load_int8_block_step,
    load_int8_step_rows,
)

if TYPE_CHECKING:
    from whisperkv.model.decoder import TextDecoder

_POINTER, _LONG = ctypes.c_void_p, ctypes.c_long


class Int8DecoderParameters(ctypes.Structure):
    """``struct wkv_int8_decoder``: the blocks' structs, the int8 table (the vocabulary's packed rows)
    and its scales, the positions, the final LayerNorm and the int8 vocabulary."""

    _fields_ = [
        ("blocks", _POINTER),
        ("layers", _LONG),
        ("embedding", _POINTER),
        ("embedding_scale", _POINTER),
        ("vocab", _LONG),
        *POSITIONS_AND_NORM_FIELDS,
        ("projection", Int8Linear_),
    ]


class Int8DecoderStep(DecoderStep):
    """``TextDecoder.forward_rows`` for one cache's rows of the int8 type: bfloat16 caches."""

    FUNCTION = "wkv_int8_decoder_step"
    BLOCK = Int8BlockStep
    CACHES = torch.bfloat16

    def __reduce__(self) -> tuple:
        return (load_int8_decoder_step, ())

    def _sources(self, decoder: TextDecoder) -> tuple | None:
        embedding, projection = decoder.token_embedding, decoder.logits_projection
        if getattr(embedding, "projection", None) is not projection or not Int8StepRows.takes(projection):
            return None  # the table is looked up from the vocabulary's packed rows (``Int8Embedding``)
        held = (projection._packed, projection._scales, projection._row_sums)
        return (decoder.positional_embedding, decoder.ln.weight, decoder.ln.bias, *held)

    def _takes(self, decoder: TextDecoder, blocks: list) -> bool:
        """A bias-free int8 vocabulary as wide as the blocks (its packed rows the embedding's, with one
        float32 scale a row), float32 positions and LayerNorm, one width throughout."""
        projection = decoder.logits_projection
        d = decoder.positional_embedding.shape[1]
        scales = projection._scales
        return (
            scales.dtype == torch.float32
            and scales.is_contiguous()
            and scales.numel() == projection.out_features
            and projection._bias is None
            and projection.in_features == d
            and positions_and_norm_take(decoder, blocks, d)
        )

    def _struct(self, decoder: TextDecoder, block_array: int, layers: int) -> tuple[ctypes.Structure, int]:
        projection = decoder.logits_projection
        positions, ln = decoder.positional_embedding, decoder.ln
        vocabulary = Int8Linear_(
            projection._packed.data_ptr(),
            projection._scales.data_ptr(),
            projection._row_sums.data_ptr(),
            None,
        )
        struct = Int8DecoderParameters(
            block_array,
            layers,
            projection._packed.data_ptr(),
            projection._scales.data_ptr(),
            projection.out_features,
            positions.data_ptr(),
            positions.shape[0],
            ln.weight.data_ptr(),
            ln.bias.data_ptr(),
            ln.eps,
            vocabulary,
        )
        return struct, projection.out_features


def load_int8_decoder_step() -> Int8DecoderStep | None:
    """The kernel, from the library ``load_kernel`` builds; None where it cannot be built."""
    built = load_kernel()
    return Int8DecoderStep(built.library) if built is not None else None


def use_int8_step(decoder: TextDecoder, on: bool = True) -> Int8StepRows | None:
    """Route an int8 decoder's steps through C (``on``, where the library builds and every linear of
    every block is held for the rows kernel) or through PyTorch between the kernels (its slow twin).
    ``use_attention_kernels`` calls it; returns the linears' kernel in use, or None."""
    rows = load_int8_step_rows() if on else None
    if rows is not None:
        for block in decoder.blocks:
            if not all(rows.takes(layer) for layer in block.step_linears()):
                rows = None
                break
    step = load_int8_block_step() if rows is not None else None
    for block in decoder.blocks:
        block.step_rows, block.block_step = rows, step
    decoder.decoder_step = load_int8_decoder_step() if step is not None else None  # the whole step
    return rows
