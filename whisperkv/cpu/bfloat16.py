"""The bfloat16 compute type: the whole network in bfloat16 arithmetic, float32 where it is cheap.

An approximation, like int8: its agreement with float32 and its WER are measured (tests,
``benchmarks/bench.py``), not assumed. What changes, and why:

* the encoder runs in bfloat16, as the int8 type's does on a CPU with native bfloat16 (head by head
  without AMX, in AMX's tiles with it: ``cpu/plan.py``); so do the Cross-KV's key and value projections
  (once per window, 1,500 positions: compute-bound like the encoder);
* every linear of a decoder step, and the tied vocabulary projection, holds its weights in bfloat16 and
  multiplies bfloat16-rounded rows with float32 sums (``Bfloat16Linear``): through AVX512-BF16's dot
  product in C (``cpu/bf16_linear.py``, ``cpu/bf16_step.py``: a linear, a block, or the whole step in
  one call) where the CPU has it; the token table is looked up from the vocabulary's bfloat16 rows;
* LayerNorms, GELU, residuals, softmax and the logits stay float32, as the float32 type computes them;
* the Self-KV and Cross-KV are held in bfloat16 where the attention kernel reads them.

Not PyTorch's plain bfloat16 model (``load_model(dtype=torch.bfloat16)``): that rounds every
activation and sum to bfloat16 and took 1.62 s on issue 46's 87 s file, against 1.21 s for float32.

On a CPU without AVX512-BF16 (or without a C compiler) the rows kernel is not offered: the type runs
its PyTorch twin (the same bfloat16 values, PyTorch's products; slower than float32 there), named so in
the weights digest, with a warning.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
from torch import nn

from whisperkv.cpu.bf16_linear import Bf16RowsKernel, Bfloat16Embedding, Bfloat16Linear, load_bf16_rows_kernel
from whisperkv.cpu.block_conversion import part_converted, widen_float16
from whisperkv.cpu.plan import ATTENTION_MARK, use_attention_kernels
from whisperkv.model.attention import MultiHeadAttention
from whisperkv.model.whisper import Whisper, state_digest


def _plain_bfloat16(linear: nn.Linear) -> nn.Linear:
    """``linear`` as a plain bfloat16 ``nn.Linear``, in place (a float32 step's row-GEMM subclass,
    ``cpu/row_gemm.py``, has nothing to do here)."""
    linear.__class__ = nn.Linear
    linear.__dict__.pop("widths", None)
    return linear.to(torch.bfloat16)


def _replace_linears(module: nn.Module, kernel: Bf16RowsKernel | None, keep: tuple[nn.Module, ...]) -> None:
    """Every nn.Linear below ``module`` but those in ``keep`` becomes a Bfloat16Linear; fused
    query/key/value ones too."""
    make = functools.partial(Bfloat16Linear, kernel=kernel)
    for child in module.modules():
        if isinstance(child, MultiHeadAttention) and child.qkv is not None:
            child.fuse_qkv(make)
    for parent in list(module.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear) and not any(child is k for k in keep):
                setattr(parent, name, Bfloat16Linear.from_linear(child, kernel))


def convert_bfloat16(
    model: Whisper,
    attention_kernel: bool = True,
    rows_kernel: bool = True,
    release: Callable[[torch.Tensor | None], None] | None = None,
) -> Whisper:
    """Turn a float32 CPU model (or its float16 tensors) into the bfloat16 compute type, in place, and
    mark its provenance.

    ``attention_kernel``: the type's own attention and caches (``use_attention_kernels``), else SDPA.
    ``rows_kernel``: the decoder's linears through the C kernel where it builds (AVX512-BF16), else
    PyTorch's float32 products of the same bfloat16 values. Chosen here, once: the weights are stored
    for one or the other. A block at a time (``cpu/block_conversion.py``): float16 rounds to bfloat16
    exactly as its float32 widening does, and what stays float32 is widened last. ``release``: as
    ``quantize_int8``'s (a memory-mapped checkpoint's pages handed back)."""
    if model.compute_type in ("int8", "bfloat16"):
        raise ValueError(f"this model is already of the {model.compute_type} compute type")
    stored = {t.dtype for t in model.state_dict().values() if t.is_floating_point()}
    if model.device.type != "cpu" or not stored <= {torch.float32, torch.float16}:
        raise ValueError(
            "the bfloat16 compute type is made from a float32 model (or its float16 tensors) on the CPU"
        )
    released = functools.partial(part_converted, release)
    # of the float32 weights, before they are replaced (without the plan a loaded model runs: its own
    # is named below, by ``use_attention_kernels``)
    base_digest = (
        state_digest(model.state_dict(), as_float32=True, after_each=release)
        if torch.float16 in stored
        else model.weights_digest.split(ATTENTION_MARK)[0]
    )
    for block in model.encoder.blocks:
        block.to(torch.bfloat16)
        released()
    model.encoder.to(torch.bfloat16)  # the convolutions, positions and final LayerNorm
    kernel = load_bf16_rows_kernel() if rows_kernel else None
    if rows_kernel and kernel is None:
        warnings.warn(
            "no bfloat16 rows kernel here (the CPU lacks AVX512-BF16, or no C compiler): the bfloat16 "
            "compute type runs its PyTorch twin, slower than float32 on this machine",
            stacklevel=2,
        )
    keep = tuple(
        _plain_bfloat16(linear)
        for block in model.decoder.blocks
        for linear in (block.cross_attn.key, block.cross_attn.value)
    )
    for block in model.decoder.blocks:
        _replace_linears(block, kernel, keep)
        released()
    # the vocabulary before the table goes: its rows are packed a few thousand at a time
    projection = Bfloat16Linear(model.decoder.token_embedding.weight, None, kernel)
    model.decoder.logits_projection = projection
    model.decoder.token_embedding = Bfloat16Embedding(projection)
    decoder = "rows kernel" if kernel is not None else "pytorch"
    model.__dict__["weights_digest"] = f"{base_digest}+bfloat16(encoder bfloat16, decoder {decoder})"
    model.compute_type = "bfloat16"
    widen_float16(model)  # what stays float32: the decoder's LayerNorms and positions
    released()
    use_attention_kernels(model, attention_kernel)
    return model
