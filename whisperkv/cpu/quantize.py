"""The int8 compute type: fewer bytes where a decoder step is memory-bound, bfloat16 where it is not.

An approximation, unlike the float32 paths: its token agreement and WER against float32 are measured
(tests and the benchmark), not assumed. What changes, and why:

* every linear layer of the decoder, and the tied vocabulary projection, keeps its weights as int8
  with one scale per output row (``Int8Linear``); activations are quantised on the fly: each row on
  its own through the C rows kernel (``cpu/int8_rows.py``) on a CPU with AVX512-VNNI or AVX2, all the
  rows of a call with one scale through fbgemm elsewhere.
  A one-token decoder step reads every weight once, so its time follows the bytes read: the
  vocabulary projection of tiny.en drops from 80 MB to 20 MB per token. Not the Cross-KV's key and
  value projections where the encoder is bfloat16: they run once per window over 1,500 positions
  (compute-bound, like the encoder), in bfloat16 too.
* the encoder is compute-bound (1,500 positions per window). With AMX for int8 a wide encoder's (small's
  and up) linears are int8 in AMX's int8 tiles, bfloat16 between them (``cpu/int8_tiles.py``: at
  large-v3-turbo's width 1.35 s a window against 1.91 in bfloat16 tiles, and half the weight bytes);
  narrower ones, and with AMX for bfloat16 alone, run in bfloat16 tiles (closer to float32 than int8);
  with AVX512-VNNI but no AMX its linears are int8 through the rows kernel, which makes twice the
  products of AVX512-BF16 (``cpu/int8_encoder.py``); elsewhere bfloat16 where the CPU has AVX512-BF16,
  else int8 through fbgemm (``encoder_choice``).
* the token embedding (the same 51,864 x d table as the vocabulary projection) is looked up from int8
  rows with their scales (``Int8Embedding``): the float32 table (80 MB for tiny.en) is not kept, and
  where the rows kernel holds the vocabulary's rows the embedding reads them there (one int8 table).
* the Self-KV and Cross-KV are held in bfloat16 where the attention kernel below reads them (half the
  bytes a step reads); float32 where SDPA does, which was slower over bfloat16 keys.
* a decoder step's attention runs through a small C kernel (``cpu/attend.py``) where a C
  compiler can build it: one pass over a window's cache for all its rows, its own order of sums; a
  bfloat16 encoder's attention runs head by head as bfloat16 products (``HeadByHeadAttention``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from whisperkv.cpu.block_conversion import part_converted, widen_float16
from whisperkv.cpu.flags import cpu_flags, cpu_has_amx_bf16, cpu_has_avx512_vnni
from whisperkv.cpu.int8_linear import Int8Embedding, Int8FusedPart, Int8Linear
from whisperkv.cpu.int8_rows import Int8RowsKernel, load_rows_kernel
from whisperkv.cpu.int8_tiles import fits_int8_tiles, int8_tiles_available, quantize_block
from whisperkv.cpu.plan import ATTENTION_MARK, use_attention_kernels
from whisperkv.cpu.row_int8 import quantized_rows
from whisperkv.model.attention import MultiHeadAttention
from whisperkv.model.whisper import Whisper, state_digest

#: the int8 type's encoders (``encoder_choice``)
ENCODERS = ("int8 tiles", "bfloat16", "int8 rows", "int8")


def _bfloat16_linear(linear: nn.Linear) -> nn.Linear:
    """``linear`` as a plain bfloat16 ``nn.Linear``, in place (a float32 step's row-GEMM subclass,
    ``cpu/row_gemm.py``, has nothing to do here)."""
    linear.__class__ = nn.Linear
    linear.__dict__.pop("widths", None)
    return linear.to(torch.bfloat16)


def cpu_has_fast_bfloat16() -> bool:
    """True when the CPU multiplies bfloat16 matrices natively (AMX or AVX512-BF16)."""
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags()) and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _replace_linears(
    module: nn.Module, kernel: Int8RowsKernel | None = None, keep: tuple[nn.Module, ...] = ()
) -> None:
    """Every nn.Linear below ``module`` but those in ``keep`` becomes an Int8Linear; a fused
    query/key/value becomes one, the three layers its thirds (``Int8FusedPart``)."""
    make = functools.partial(Int8Linear, kernel=kernel)
    for child in module.modules():
        if isinstance(child, MultiHeadAttention) and child.qkv is not None:
            child.fuse_qkv(make)  # per-row scales: the same int8 rows the three layers would get
            child.query, child.key, child.value = (Int8FusedPart(child.qkv, part) for part in range(3))
    for parent in list(module.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear) and not any(child is k for k in keep):
                setattr(parent, name, Int8Linear.from_linear(child, kernel))


#: the narrowest encoder the int8 type runs in the int8 tiles by default (small's). Narrower ones keep the
#: bfloat16 tiles, nearer float32 (tiny.en's encoder output 2.5x nearer), where int8 gained little:
#: 47-50 against 52 ms a window for tiny.en, 104-111 against 116-118 for base; small 240-251 against
#: 305-323, large-v3-turbo 1.35 against 1.91 s (2-core AMX Xeon, session 64)
INT8_TILES_MIN_WIDTH = 768


def encoder_choice(kernel: Int8RowsKernel | None, width: int | None = None) -> str:
    """The int8 type's encoder on this CPU for an encoder of ``width`` (None: the widest's choice): ``int8
    tiles`` with AMX for int8 and bfloat16 from ``INT8_TILES_MIN_WIDTH`` (int8 linears in AMX's int8 tiles,
    bfloat16 between them: ``cpu/int8_tiles.py``), else ``bfloat16`` in AMX's bfloat16 tiles; else ``int8
    rows``, its linears through the rows kernel (AVX512-VNNI's int8 products, each of a window's positions
    quantised on its own, as a decoder step's rows are) where that builds with VNNI; else ``bfloat16`` where
    the CPU multiplies it natively (AVX512-BF16); else ``int8`` (fbgemm). On AVX2 alone the rows kernel's
    16-bit products, each weight block widened once (e446146), reached 235 and 266 GFLOP/s at turbo's width
    against fbgemm's 273 and 300, at half fbgemm's distance to the exact product, and two turbo encoder layers
    took 875 ms against fbgemm's 742 (2-core AMD EPYC Zen 3, ``benchmarks/encoder_int8.py`` at 9d3fd70; 343 ms
    a tiny.en window against fbgemm's 210 before): fbgemm's speed keeps it there.

    Why int8 before bfloat16 without AMX: AVX512-VNNI does twice the products of AVX512-BF16 an
    instruction. At large-v3-turbo's width (1,500 positions, 1280 -> 5120 and 5120 -> 1280) the rows
    kernel took 58 CPU ms each against PyTorch's bfloat16 linears' 99, and two encoder layers 687 against
    971 CPU ms (2-core AMD EPYC Zen 4, shared machine, medians of 5: ``benchmarks/encoder_int8.py``);
    tiny.en's words: 163 errors against bfloat16's 170 in 2,288 (``benchmarks/int8_variants.py``)."""
    if cpu_has_amx_bf16() and cpu_has_fast_bfloat16():
        return (
            "int8 tiles"
            if int8_tiles_available()
            and (width is None or (width >= INT8_TILES_MIN_WIDTH and fits_int8_tiles(width)))
            else "bfloat16"
        )
    if kernel is not None and cpu_has_avx512_vnni():
        return "int8 rows"
    return "bfloat16" if cpu_has_fast_bfloat16() else "int8"


def quantize_int8(
    model: Whisper,
    encoder_bfloat16: bool | None = None,
    attention_kernel: bool = True,
    rows_kernel: bool = True,
    encoder: str | None = None,
    release: Callable[[torch.Tensor | None], None] | None = None,
) -> Whisper:
    """Turn a float32 CPU model into the int8 compute type, in place, and mark its provenance.

    ``encoder``: ``bfloat16``, ``int8 rows`` (its linears through the rows kernel), ``int8`` (fbgemm) or
    None, which picks for this CPU (``encoder_choice``). ``encoder_bfloat16`` (older spelling): True is
    ``bfloat16``, False ``int8``.
    ``attention_kernel``: the type's own attention (``use_attention_kernels``), else SDPA.
    ``rows_kernel``: the decoder's linears and vocabulary projection through the C kernel
    (``cpu/int8_rows.py``) where it builds, else fbgemm. Chosen here, once: the weights are stored
    for one or the other.
    ``release``: called with each stored tensor once it has been read whole, and with None once a block
    has been converted (a memory-mapped checkpoint's pages handed back, ``weights/mapped.py``).
    """
    if model.compute_type == "int8":
        raise ValueError("this model is already of the int8 compute type")
    stored = {t.dtype for t in model.state_dict().values() if t.is_floating_point()}
    if model.device.type != "cpu" or not stored <= {torch.float32, torch.float16}:
        raise ValueError("int8 quantisation needs a float32 model (or its float16 tensors) on the CPU")
    kernel = load_rows_kernel() if rows_kernel else None
    if encoder is None and encoder_bfloat16 is not None:
        encoder = "bfloat16" if encoder_bfloat16 else "int8"
    encoder = encoder or encoder_choice(kernel, model.dims.n_audio_state)
    unavailable = (encoder == "int8 rows" and kernel is None) or (
        encoder == "int8 tiles" and not (int8_tiles_available() and fits_int8_tiles(model.dims.n_audio_state))
    )
    if encoder not in ENCODERS or unavailable:
        raise ValueError(
            f"unknown or unavailable int8 encoder {encoder!r}: int8 tiles, bfloat16, int8 rows or int8"
        )
    bfloat16_between = encoder in ("int8 tiles", "bfloat16")  # the encoder's dtype between its linears
    released = functools.partial(part_converted, release)
    # of the float32 weights, before they are replaced (without a float32 plan's attention: a model
    # loaded as float32 and quantised here would otherwise lose this part of the name to it)
    base_digest = (
        state_digest(model.state_dict(), as_float32=True, after_each=release)
        if torch.float16 in stored
        else model.weights_digest.split(ATTENTION_MARK)[0]
    )
    # the encoder and the blocks first: their float32 tensors are gone before the vocabulary table's
    # int8 copies are made, so the load's peak holds fewer float32 and int8 copies at once
    for block in model.encoder.blocks:  # float16 tensors converted a block at a time: one float32 block
        if encoder == "bfloat16":
            block.to(torch.bfloat16)  # the caches' dtype follows the attention (use_attention_kernels)
        elif encoder == "int8 tiles":
            quantize_block(block)  # float16 rows widened as quantised
        else:
            widen_float16(block, linear_weights=False)  # the linears' rows are widened as quantised
            _replace_linears(block, kernel if encoder == "int8 rows" else None)
        released()  # the block's float16 and float32 copies, not left in the heap's middle
    if bfloat16_between:
        model.encoder.to(torch.bfloat16)  # the convolutions, positions and final LayerNorm
    keep = _quantize_decoder(model, kernel, bfloat16_between, release)
    # each row quantised on its own (the kernel) or all rows with one scale (fbgemm): other numbers
    decoder = ", decoder rows kernel" if kernel is not None else ""
    decoder += ", cross-KV projection bfloat16" if keep else ""
    model.__dict__["weights_digest"] = f"{base_digest}+int8(encoder {encoder}{decoder})"
    model.compute_type = "int8"
    widen_float16(model)  # what stays float32: LayerNorms, convolutions, positional embeddings
    released()
    use_attention_kernels(model, attention_kernel)
    return model


def _quantize_decoder(
    model: Whisper,
    kernel: Int8RowsKernel | None,
    bfloat16_cross: bool,
    release: Callable[[torch.Tensor | None], None] | None,
) -> tuple[nn.Module, ...]:
    """The decoder's blocks a block at a time, then the vocabulary table's int8 rows; returns the
    Cross-KV projections kept in bfloat16.

    The Cross-KV projection is compute-bound like the encoder (1,500 positions a window, once per
    window): where the encoder runs in bfloat16, so does it (its keys and values are held in bfloat16
    anyway). Int8 there took 15.8 ms a window for tiny.en against 5.7 in bfloat16 (scratch, round 16:
    per-row quantised, through the rows kernel made for a step's few rows, on an AMX CPU)."""
    released = functools.partial(part_converted, release)
    keep: tuple[nn.Module, ...] = ()
    if bfloat16_cross:
        keep = tuple(
            _bfloat16_linear(linear)
            for block in model.decoder.blocks
            for linear in (block.cross_attn.key, block.cross_attn.value)
        )
    for block in model.decoder.blocks:
        widen_float16(block, linear_weights=False)
        _replace_linears(block, kernel, keep)
        released()
    # the table as stored (float16 or float32), its rows widened a block at a time and quantised once
    # (the projection's, packed from them; the embedding's, read from the packed rows or kept as they are)
    table = model.decoder.token_embedding.weight
    rows = quantized_rows(table, release)  # its pages handed back as read, before the packed copy is made
    model.decoder.logits_projection = Int8Linear(table, None, kernel, rows)
    model.decoder.token_embedding = Int8Embedding(table, rows, model.decoder.logits_projection)
    released()
    return keep
