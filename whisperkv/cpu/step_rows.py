"""A float32 decoder step's linears, each with its LayerNorm, bias, GELU and residual, in one C call.

Why: a float32 decoder step of tiny.en spent about as long in the small tensor operations around its
24 products (padding a lone row to two columns, transposes, copies, LayerNorms, bias, GELU, residual
adds: a dozen PyTorch calls per linear) as in the products themselves (a profile of
``TextDecoder.forward_rows``: 1.5 ms of products and about 2 ms of the rest). ``kernels/rows_f32.c``
does a linear and everything around it in one call, every output of every row one dot product in a
fixed order: a row's bits depend neither on the rows beside it nor on the thread count (no chunk-width
rule as ``cpu/row_gemm.py`` needs for MKL).

``DecoderBlock.forward_rows`` and the ``rows-gemm`` vocabulary projection run through it where a float32
CPU model has the kernels' library (``use_step_rows``, called by ``use_attention_kernels``); the
row-GEMM path stays as its slow twin (``use_attention_kernels(model, rows=False)``), and the digest of
weights names which one made a model's numbers. With it, ``DecoderBlock.forward`` (a prompt, a per-step
loop) takes the same calls.

Where every value of a matrix the kernel reads is a float16 (both bundled models are stored so), it is
held in float16 (``half_copy``): the vocabulary table and the step's linears. The kernel widens each
value exactly, so every product keeps its bits from half the bytes a step reads (tiny.en: 40 + 16 MB,
not 80 + 33; a replayed engine step, scratch, round 12: 5.17 against 6.10 ms with float32 linears, base
6.04 against 7.56). The PyTorch paths that multiply by them (the uncached twin, language detection, word
timing's pass over a window's text) widen them per call (``row_gemm.widened``); ``rows=False`` stores
float32 again, so the row GEMMs' steps widen nothing.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.block_step import use_block_step
from whisperkv.cpu.decoder_step import load_decoder_step
from whisperkv.cpu.gemm_step import RowGemmStep
from whisperkv.cpu.vocab import ChunkedRowProjection

LANES = 16  # the input width must be a multiple of it (LANES in rows_f32.c)


class StepRowsKernel:
    """``y = epilogue(W · LayerNorm(x) + b)`` for float32 rows [n, in] in one C call (``rows_f32.c``)."""

    reads_float_tables = True  # the rows-gemm vocabulary projection multiplies through it (``cpu/vocab.py``)

    def __init__(self, library: ctypes.CDLL) -> None:
        self._rows = library.wkv_rows_f32
        self._rows.restype = ctypes.c_int
        self._rows.argtypes = rows_argtypes(weights=2)  # the weight and its bias
        #: the same for float16 weights, widened exactly in the kernel (``half_copy``)
        self._half = library.wkv_rows_f32_half
        self._half.restype, self._half.argtypes = ctypes.c_int, self._rows.argtypes
        #: the LayerNorm the kernel gives its rows, alone (one row a call)
        self._norm = layer_norm_function(library)

    def __deepcopy__(self, memo: dict) -> StepRowsKernel:
        return self  # a loaded library: nothing in it to copy (ctypes handles cannot be)

    def __reduce__(self) -> tuple:
        return (load_step_rows, ())  # another process loads (or builds) its own

    @staticmethod
    def takes(weight: torch.Tensor) -> bool:
        """Whether a linear's weight [out, in] is one this kernel multiplies."""
        return (
            weight.dim() == 2
            and weight.dtype in (torch.float32, torch.float16)
            and weight.device.type == "cpu"
            and weight.is_contiguous()
            and weight.shape[1] % LANES == 0
        )

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        norm: nn.LayerNorm | None = None,
        gelu: bool = False,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Rows ``x`` [n, in] (float32, unit stride along a row) → [n, out]: ``norm`` first when given,
        then the product and ``bias``, then GELU when ``gelu``, then ``+ residual`` [n, out] when given.
        A float16 ``weight`` is widened exactly: the product has the bits of its float32 copy's."""
        rows = self._half if weight.dtype == torch.float16 else self._rows
        pointers = (weight.data_ptr(), bias.data_ptr() if bias is not None else None)
        return call_rows(rows, x, pointers, weight.shape[0], norm, gelu, residual, "the step rows kernel")

    def layer_norm(self, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        """``norm(x)`` as this kernel normalises the rows of a call with ``norm``: where the final
        LayerNorm's rows are projected apart from it, the same bits."""
        return layer_norm_rows(self._norm, x, norm)

    def through(
        self,
        x: torch.Tensor,
        layer: nn.Linear,
        norm: nn.LayerNorm | None = None,
        gelu: bool = False,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``layer``'s weight and bias on rows ``x`` (``__call__``): how a block's step calls its linears,
        whatever kernel holds them (the int8 type's: ``cpu/int8_step.py``)."""
        return self(x, layer.weight, layer.bias, norm=norm, gelu=gelu, residual=residual)


def layer_norm_function(library: ctypes.CDLL) -> ctypes._CFuncPtr:
    """``wkv_layer_norm``: the LayerNorm both types' step kernels give their rows (``rows_f32.c``)."""
    fn = library.wkv_layer_norm
    pointer = ctypes.c_void_p
    fn.restype, fn.argtypes = None, [pointer, ctypes.c_long, pointer, pointer, ctypes.c_float, pointer]
    return fn


def layer_norm_rows(fn: ctypes._CFuncPtr, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """``norm(x)`` through ``fn`` (``layer_norm_function``) row by row: float32 rows, the width a
    multiple of ``LANES``."""
    width = x.shape[-1]
    rows = x.reshape(-1, width).contiguous()
    out = torch.empty_like(rows)
    weight, bias = norm.weight.data_ptr(), norm.bias.data_ptr()
    step = width * rows.element_size()
    for r in range(rows.shape[0]):
        fn(rows.data_ptr() + r * step, width, weight, bias, norm.eps, out.data_ptr() + r * step)
    return out.view(x.shape)


def rows_argtypes(weights: int) -> list:
    """The ctypes argument types of a rows kernel with ``weights`` pointers of its own: the layout
    ``call_rows`` passes (rows, their LayerNorm, scratch; the weights; widths, GELU, residual, output)."""
    pointer, long = ctypes.c_void_p, ctypes.c_long
    rows = [pointer, long, long, pointer, pointer, ctypes.c_float, pointer]
    epilogue = [long, long, ctypes.c_int, pointer, long, pointer, long]
    return rows + [pointer] * weights + epilogue


def call_rows(
    fn: ctypes._CFuncPtr,
    x: torch.Tensor,
    weights: tuple,
    out: int,
    norm: nn.LayerNorm | None,
    gelu: bool,
    residual: torch.Tensor | None,
    what: str,
) -> torch.Tensor:
    """One call of a rows kernel with the layout both share (``wkv_rows_f32`` and, for the int8 type,
    ``wkv_int8_rows_step``): rows ``x`` [n, in] and their LayerNorm, the kernel's own ``weights``
    pointers, then the epilogue (GELU, residual) and the output [n, out]."""
    n, width = x.shape
    y = torch.empty(n, out)
    scratch = torch.empty(n, width) if norm is not None else None
    failed = fn(
        x.data_ptr(),
        n,
        x.stride(0),
        norm.weight.data_ptr() if norm is not None else None,
        norm.bias.data_ptr() if norm is not None else None,
        norm.eps if norm is not None else 0.0,
        scratch.data_ptr() if scratch is not None else None,
        *weights,
        out,
        width,
        int(gelu),
        residual.data_ptr() if residual is not None else None,
        residual.stride(0) if residual is not None else 0,
        y.data_ptr(),
        out,
    )
    if failed:  # the callers' ``takes`` keep this from happening
        raise ValueError(f"{what} does not take a {out} x {width} matrix for {n} rows (code {failed})")
    return y


def half_copy(table: torch.Tensor) -> torch.Tensor | None:
    """A float16 copy of a float32 matrix whose every value is a float16 (a checkpoint stored in float16,
    as both bundled models are), else None: read through the kernel, it gives the float32 matrix's bits
    from half the bytes (a float32 step reads each of its matrices once)."""
    half = table.half()
    for start in range(0, table.shape[0], 4096):  # in blocks: no float32 temporary of the whole table
        if not torch.equal(half[start : start + 4096].float(), table[start : start + 4096]):
            return None
    return half


def load_step_rows() -> StepRowsKernel | None:
    """The kernel, from the library ``load_kernel`` builds; None where it cannot be built."""
    built = load_kernel()
    return StepRowsKernel(built.library) if built is not None else None


def use_step_rows(decoder: nn.Module, on: bool = True) -> StepRowsKernel | None:
    """Route a float32 CPU decoder's steps through the kernel (``on``, where it is built and takes every
    linear) or through the row GEMMs: its blocks' linears, the vocabulary projection (``rows-gemm``),
    the storage of the table and the linears (float16 where exact, for the kernel; float32 for the
    GEMMs). Returns the kernel in use, or None.
    ``use_attention_kernels`` calls it."""
    kernel = _kernel_for(decoder) if on else None
    for block in decoder.blocks:
        block.step_rows = kernel
    use_block_step(decoder, on=kernel is not None)  # a lone window's step: a block in one call
    # ... and the whole step: in one C call, or (the row GEMMs) in one Python function, its twin's bits
    decoder.decoder_step = load_decoder_step() if kernel is not None else RowGemmStep()
    _store_linears(decoder, half=kernel is not None)
    projection = decoder.logits_projection
    if isinstance(projection, ChunkedRowProjection):  # the rows-gemm vocabulary: the same kernel, or GEMMs
        projection.kernel = kernel
        _store_table(decoder, half=kernel is not None)
    return kernel


def _kernel_for(decoder: nn.Module) -> StepRowsKernel | None:
    """The kernel, if it is built and takes every linear of the decoder's steps."""
    kernel = load_step_rows()
    if kernel is None:
        return None
    for block in decoder.blocks:
        weights = [getattr(layer, "weight", None) for layer in block.step_linears()]
        if not all(w is not None and kernel.takes(w) for w in weights):
            return None
    return kernel


def _restored(weight: torch.Tensor, half: bool) -> torch.Tensor | None:
    """``weight`` as the steps should hold it (``half``: float16 where exact, ``half_copy``; else
    float32), or None where it is held so already (or a float16 cannot hold its values)."""
    weight = weight.detach()
    if half and weight.dtype == torch.float32:
        return half_copy(weight)
    if not half and weight.dtype == torch.float16:
        return weight.float()
    return None


def _store_linears(decoder: nn.Module, half: bool) -> None:
    """The six linears of each block's step in float16 where the kernel reads them and every value is a
    float16, else in float32. The fused query|key|value matrix keeps the three layers as views of it
    (``MultiHeadAttention.fuse_qkv``): no weight is held twice."""
    for block in decoder.blocks:
        attn = block.attn
        for layer in block.step_linears():
            stored = _restored(layer.weight, half)
            if stored is None:
                continue
            if layer is attn.qkv:  # a plain holder of the fused matrix; the three layers view it
                layer.weight = stored
                views = stored.split(attn.query.weight.shape[0])
                attn.query.weight, attn.key.weight, attn.value.weight = (
                    nn.Parameter(view, requires_grad=False) for view in views
                )
            else:
                layer.weight = nn.Parameter(stored, requires_grad=False)


def _store_table(decoder: nn.Module, half: bool) -> None:
    """The tied vocabulary table in float16 where the kernel reads it and every value is a float16
    (``half_copy``: the same logits, bit for bit, from half the bytes and half the memory), else in
    float32 (the row GEMMs, PyTorch's products)."""
    stored = _restored(decoder.token_embedding.weight, half)
    if stored is None:  # held so already, or values a float16 cannot hold: the float32 table stays
        return
    decoder.token_embedding.weight = nn.Parameter(stored, requires_grad=False)
    decoder.logits_projection.weight = stored
