"""A float32 decoder step of one cache through the row GEMMs in one Python function: no module calls.

Why: where the kernels' library cannot be built (no C compiler), a decoder step runs
``TextDecoder.forward_rows`` on the row GEMMs (``cpu/row_gemm.py``). There each of a block's six linears
goes through a module call, ``linear_rows``, ``_apply``'s checks and a reshape each way, and attention
through ``attend_self`` / ``attend_cross``'s per-cache loops: about 1,000 PyTorch operations and as many
Python frames a step of tiny.en, which cost 1.1-1.5 ms of an 11.5 ms step on a 2-core AMD EPYC (scratch,
session 71; the rest is reading 131 MB of weights, caches and vocabulary). ``RowGemmStep`` makes the
same products (``row_gemm.rows_times``), the same attention calls (``attend_through``), the same
LayerNorms, GELU and residual adds on the same rows in the same order, so every logit is
``forward_rows``'s bit for bit (tests hold the two to ``torch.equal``), from one function.

It takes a lone cache's rows at one new position (greedy, a window's beams or samples) where every
linear of the step is a float32 row GEMM: the float32 type without the step rows kernel
(``use_step_rows`` sets it as ``decoder.decoder_step``, the C one-call step's place). Anything else
returns None and the caller steps through ``forward_rows``, its twin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from whisperkv.cpu.row_gemm import FusedRowGemm, RowGemmLinear, rows_times
from whisperkv.model.attention import attend_through, heads

if TYPE_CHECKING:
    from torch import nn

    from whisperkv.cache.kv import CrossKV, DecoderCache, SelfKV
    from whisperkv.model.decoder import DecoderBlock, TextDecoder


class RowGemmStep:
    """``TextDecoder.forward_rows`` for one cache's rows, the row GEMMs called directly (no state: it
    reads the decoder's layers every step, so a moved or re-routed model is read as it is now)."""

    def logits(self, decoder: TextDecoder, tokens: torch.Tensor, cache: DecoderCache) -> torch.Tensor | None:
        """Logits [n, vocab] of the next position for ``tokens`` [n, 1], one per row of ``cache``, which
        grows by that position; or None (nothing changed) where the step is not all row GEMMs."""
        if tokens.dim() != 2 or tokens.shape[1] != 1 or not tokens.is_cpu or not takes(decoder):
            return None
        n = tokens.shape[0]
        x = decoder._embed(tokens, cache.offset)  # [n, 1, d]: raises past the text context, as the twin
        d = x.shape[-1]
        x = x.view(n, d)
        for block, self_kv, cross_kv in zip(decoder.blocks, cache.self_kv, cache.cross_kv, strict=True):
            x = _block(block, x, self_kv, cross_kv)
        cache.record_tokens(tokens)
        return decoder._logits(x.view(n, 1, d), [n])[:, -1]


def takes(decoder: TextDecoder) -> bool:
    """Whether every linear of the decoder's steps is a float32 row GEMM on the CPU (no kernel's)."""
    for block in decoder.blocks:
        if getattr(block, "step_rows", None) is not None:
            return False
        for layer in block.step_linears():  # an unfused query|key|value (None) is not taken
            if not isinstance(layer, (FusedRowGemm, RowGemmLinear)):
                return False
            if layer.weight.dtype != torch.float32 or not layer.weight.is_cpu:
                return False
    return True


def _block(block: DecoderBlock, x: torch.Tensor, self_kv: SelfKV, cross_kv: CrossKV) -> torch.Tensor:
    """``DecoderBlock.forward_rows`` of one cache's rows ``x`` [n, d]: the same calls on the same rows."""
    attn, cross = block.attn, block.cross_attn
    n, d = x.shape
    q, k, v = _linear(attn.qkv, _norm(block.attn_ln, x)).view(n, 1, 3 * d).chunk(3, dim=-1)
    offset = self_kv.length
    self_kv.append(heads(k, attn.n_head), heads(v, attn.n_head))
    attended = attend_through(attn.kernel, q, self_kv.key, self_kv.value, offset)
    x = x + _linear(attn.out, attended.reshape(n, d))
    q = _linear(cross.query, _norm(block.cross_attn_ln, x)).view(n, 1, d)
    attended = attend_through(cross.kernel, q, cross_kv.key, cross_kv.value)
    x = x + _linear(cross.out, attended.reshape(n, d))
    up, activation, down = block.mlp
    return x + _linear(down, activation(_linear(up, _norm(block.mlp_ln, x))))


def _norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _linear(layer: FusedRowGemm | RowGemmLinear, x: torch.Tensor) -> torch.Tensor:
    """``layer`` of rows ``x`` [n, in], the rows one group, as ``RowGemmLinear`` multiplies a step's."""
    return rows_times(layer.weight, x, layer.widths, None, layer.bias)
