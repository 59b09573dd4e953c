"""The int8 type's decoder step in C: each linear with what is around it, then a whole block per call.

Why: the int8 type's step made its products and attentions in C but everything between them in
PyTorch (three LayerNorms, GELU, three residual adds, splitting heads, rounding the new keys and
values into the bfloat16 Self-KV): ``benchmarks/profile_step.py --compute_type int8`` measured 2.15 of
a 3.85 ms step of tiny.en outside the kernels (round 14, Intel VM). Two layers, as for float32
(``cpu/step_rows.py``, ``cpu/block_step.py``):

* ``Int8StepRows``: one linear with its LayerNorm, bias, GELU and residual in one C call
  (``wkv_int8_rows_step`` in ``kernels/int8_rows.c``), called by ``DecoderBlock._forward_rows_kernel``:
  the call-by-call path, the twin;
* ``Int8BlockStep``: the same calls in the same order from C for a lone window's rows
  (``kernels/int8_block_step.c``): the twin's bits (tested with ``torch.equal``), without the Python.

The LayerNorm and GELU are now C's (``kernels/rows_f32.c``, rounded as written), not PyTorch's: the
int8 type's numbers moved in the last bits. It is an approximation whose agreement with float32 and
WER are measured, not assumed (tests, ``benchmarks/bench.py``). ``use_attention_kernels(model,
rows=False)`` keeps the PyTorch path; the weights digest names which one made a model's numbers.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import torch
from torch import nn

from whisperkv.cpu.attend import HEAD, load_kernel
from whisperkv.cpu.block_step import BlockStep
from whisperkv.cpu.step_rows import call_rows, layer_norm_function, layer_norm_rows, rows_argtypes

if TYPE_CHECKING:
    from whisperkv.cpu.int8_linear import Int8Linear
    from whisperkv.model.decoder import DecoderBlock

_POINTER, _FLOAT, _LONG = ctypes.c_void_p, ctypes.c_float, ctypes.c_long
LANES = 16  # a LayerNorm's width must be a multiple of it (wkv_layer_norm)


class Int8StepRows:
    """``y = epilogue(Int8Linear(LayerNorm(x)))`` for float32 rows [n, in] in one C call."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._rows = library.wkv_int8_rows_step
        self._rows.restype = ctypes.c_int
        self._rows.argtypes = rows_argtypes(weights=4)  # packed weights, scales, row sums, bias
        self._norm = layer_norm_function(library)  # the LayerNorm it gives its rows, alone

    def __deepcopy__(self, memo: dict) -> Int8StepRows:
        return self  # a loaded library: nothing in it to copy (ctypes handles cannot be)

    def __reduce__(self) -> tuple:
        return (load_int8_step_rows, ())  # another process loads (or builds) its own

    @staticmethod
    def takes(layer: object) -> bool:
        """Whether ``layer`` is an ``Int8Linear`` held for the rows kernel (``cpu/int8_rows.py``)."""
        from whisperkv.cpu.int8_linear import Int8Linear

        return isinstance(layer, Int8Linear) and layer.kernel is not None and layer.in_features % LANES == 0

    def layer_norm(self, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        """``norm(x)`` as this kernel normalises the rows of a call with ``norm``: the same bits."""
        return layer_norm_rows(self._norm, x, norm)

    def through(
        self,
        x: torch.Tensor,
        layer: Int8Linear,
        norm: nn.LayerNorm | None = None,
        gelu: bool = False,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Rows ``x`` [n, in] (float32, unit stride along a row) → [n, out]: ``norm`` first when given,
        then ``layer``'s int8 product and bias, then GELU when ``gelu``, then ``+ residual`` [n, out]."""
        pointers = (layer._packed, layer._scales, layer._row_sums, layer._bias)
        pointers = tuple(t.data_ptr() if t is not None else None for t in pointers)
        return call_rows(
            self._rows, x, pointers, layer.out_features, norm, gelu, residual, "the int8 step kernel"
        )


class Int8Linear_(ctypes.Structure):  # noqa: N801 - the C struct's name, wkv_int8_linear
    """``struct wkv_int8_linear``: one ``Int8Linear`` as the rows kernel holds it."""

    _fields_ = [(name, _POINTER) for name in ("packed", "scale", "sum", "bias")]


class Int8BlockParameters(ctypes.Structure):
    """``struct wkv_int8_block``: pointers to one block's LayerNorms and int8 linears."""

    _fields_ = (
        [(name, _POINTER) for name in ("attn_ln_w", "attn_ln_b", "cross_ln_w", "cross_ln_b")]
        + [(name, _POINTER) for name in ("mlp_ln_w", "mlp_ln_b")]
        + [(name, _FLOAT) for name in ("attn_ln_eps", "cross_ln_eps", "mlp_ln_eps")]
        + [(name, Int8Linear_) for name in ("qkv", "out", "query", "cross_out", "up", "down")]
        + [(name, _LONG) for name in ("d", "hidden", "heads")]
    )


class Int8BlockStep(BlockStep):
    """``DecoderBlock``'s int8 step through ``wkv_int8_block_step``: bfloat16 caches."""

    FUNCTION = "wkv_int8_block_step"
    CACHES = torch.bfloat16

    def __reduce__(self) -> tuple:
        return (load_int8_block_step, ())

    def _make(self, block: DecoderBlock) -> tuple[ctypes.Structure | None, list[torch.Tensor]]:
        norms = [block.attn_ln, block.cross_attn_ln, block.mlp_ln]
        return int8_block_parameters(norms, list(block.step_linears()), block.attn.n_head)


def int8_block_parameters(
    norms: list[nn.LayerNorm], layers: list[Int8Linear], n_head: int
) -> tuple[Int8BlockParameters | None, list[torch.Tensor]]:
    """The struct for a block's three LayerNorms and six int8 linears (query|key|value, out, cross
    query, cross out, up, down), and the tensors it points into; (None, []) where a part is not the
    kernel's (a linear not held for the rows kernel, a shape or dtype it does not take)."""
    d = n_head * HEAD
    if not all(Int8StepRows.takes(layer) for layer in layers) or layers[1].in_features != d:
        return None, []
    tensors = [t for norm in norms for t in (norm.weight, norm.bias)]
    if not all(t.dtype == torch.float32 and t.is_contiguous() and t.numel() == d for t in tensors):
        return None, []
    linears = []
    for layer in layers:
        held = [layer._packed, layer._scales, layer._row_sums]
        held += [layer._bias] if layer._bias is not None else []
        tensors += held
        pointers = [t.data_ptr() for t in held[:3]] + [held[3].data_ptr() if len(held) == 4 else None]
        linears.append(Int8Linear_(*pointers))
    made = Int8BlockParameters(
        *[t.data_ptr() for t in tensors[:6]],
        *[norm.eps for norm in norms],
        *linears,
        d,
        layers[4].out_features,
        n_head,
    )
    return made, tensors


def load_int8_step_rows() -> Int8StepRows | None:
    """The linears' kernel, from the library ``load_kernel`` builds; None where it cannot be built."""
    built = load_kernel()
    return Int8StepRows(built.library) if built is not None else None


def load_int8_block_step() -> Int8BlockStep | None:
    """The block's kernel, from the same library; None where it cannot be built."""
    built = load_kernel()
    return Int8BlockStep(built.library) if built is not None else None
