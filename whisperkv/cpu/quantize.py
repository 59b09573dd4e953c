"""The int8 compute type: fewer bytes where a decoder step is memory-bound, bfloat16 where it is not.

An approximation, unlike the float32 paths: its token agreement and WER against float32 are measured
(tests and the benchmark), not assumed. What changes, and why:

* every linear layer of the decoder, and the tied vocabulary projection, keeps its weights as int8
  with one scale per output row (``Int8Linear``); activations are quantised on the fly: each row on
  its own through the C rows kernel (``cpu/int8_rows.py``) on a CPU with AVX512-VNNI, all the rows
  of a call with one scale through fbgemm elsewhere.
  A one-token decoder step reads every weight once, so its time follows the bytes read: the
  vocabulary projection of tiny.en drops from 80 MB to 20 MB per token. Not the Cross-KV's key and
  value projections where the encoder is bfloat16: they run once per window over 1,500 positions
  (compute-bound, like the encoder), in bfloat16 too.
* the encoder is compute-bound (1,500 positions per window). On a CPU with native bfloat16 matrix
  instructions (AMX / AVX512-BF16) it runs in bfloat16, which is both faster and closer to float32
  than int8 there; elsewhere its linear layers become ``Int8Linear`` too.
* the token embedding (the same 51,864 x d table as the vocabulary projection) is looked up from int8
  rows with their scales (``Int8Embedding``): the float32 table (80 MB for tiny.en) is not kept.
* the Self-KV and Cross-KV are held in bfloat16 where the attention kernel below reads them (half the
  bytes a step reads); float32 where SDPA does, which was slower over bfloat16 keys.
* a decoder step's attention runs through a small C kernel (``cpu/attend.py``) where a C
  compiler can build it: one pass over a window's cache for all its rows, its own order of sums; a
  bfloat16 encoder's attention runs head by head as bfloat16 products (``HeadByHeadAttention``).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from whisperkv.cpu.flags import cpu_flags
from whisperkv.cpu.int8_linear import Int8Embedding, Int8Linear
from whisperkv.cpu.int8_rows import Int8RowsKernel, load_rows_kernel
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.model.attention import MultiHeadAttention
from whisperkv.model.whisper import Whisper


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
    """Every nn.Linear below ``module`` but those in ``keep`` becomes an Int8Linear; fused
    query/key/value ones too."""
    make = functools.partial(Int8Linear, kernel=kernel)
    for child in module.modules():
        if isinstance(child, MultiHeadAttention) and child.qkv is not None:
            child.fuse_qkv(make)  # per-row scales: the same int8 rows the three layers get
    for parent in list(module.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear) and not any(child is k for k in keep):
                setattr(parent, name, Int8Linear.from_linear(child, kernel))


def quantize_int8(
    model: Whisper,
    encoder_bfloat16: bool | None = None,
    attention_kernel: bool = True,
    rows_kernel: bool = True,
) -> Whisper:
    """Turn a float32 CPU model into the int8 compute type, in place, and mark its provenance.

    ``encoder_bfloat16``: None picks bfloat16 for the encoder when the CPU has native support.
    ``attention_kernel``: the type's own attention (``use_attention_kernels``), else SDPA.
    ``rows_kernel``: the decoder's linears and vocabulary projection through the C kernel
    (``cpu/int8_rows.py``) where it builds, else fbgemm. Chosen here, once: the weights are stored
    for one or the other.
    """
    if model.compute_type == "int8":
        raise ValueError("this model is already of the int8 compute type")
    if model.device.type != "cpu" or model.dtype != torch.float32:
        raise ValueError("int8 quantisation needs a float32 model on the CPU")
    if encoder_bfloat16 is None:
        encoder_bfloat16 = cpu_has_fast_bfloat16()
    base_digest = model.weights_digest  # of the float32 weights, before they are replaced
    # the encoder and the blocks first: their float32 tensors are gone before the vocabulary table's
    # int8 copies are made, so the load's peak holds fewer float32 and int8 copies at once
    if encoder_bfloat16:
        model.encoder.to(torch.bfloat16)  # the caches' dtype follows the attention (use_attention_kernels)
    else:
        _replace_linears(model.encoder.blocks)
    kernel = load_rows_kernel() if rows_kernel else None
    # the Cross-KV projection is compute-bound like the encoder (1,500 positions a window, once per
    # window): where the encoder runs in bfloat16, so does it (its keys and values are held in bfloat16
    # anyway). Int8 there took 15.8 ms a window for tiny.en against 5.7 in bfloat16 (scratch, round 16:
    # per-row quantised, through the rows kernel made for a step's few rows).
    keep: tuple[nn.Module, ...] = ()
    if encoder_bfloat16:
        keep = tuple(
            _bfloat16_linear(linear)
            for block in model.decoder.blocks
            for linear in (block.cross_attn.key, block.cross_attn.value)
        )
    _replace_linears(model.decoder.blocks, kernel, keep)
    model.decoder.logits_projection = Int8Linear(model.decoder.token_embedding.weight, None, kernel)
    model.decoder.token_embedding = Int8Embedding(model.decoder.token_embedding.weight)
    encoder = "bfloat16" if encoder_bfloat16 else "int8"
    # each row quantised on its own (the kernel) or all rows with one scale (fbgemm): other numbers
    decoder = ", decoder rows kernel" if kernel is not None else ""
    decoder += ", cross-KV projection bfloat16" if keep else ""
    model.__dict__["weights_digest"] = f"{base_digest}+int8(encoder {encoder}{decoder})"
    model.compute_type = "int8"
    use_attention_kernels(model, attention_kernel)
    return model
