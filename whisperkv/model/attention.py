"""Multi-head attention that reads keys/values from explicit tensors (or cache objects), never hooks.

One module serves the three uses in Whisper:
* encoder self-attention: queries, keys and values all from the same 1,500 positions;
* decoder masked self-attention: keys/values come from the ``SelfKV`` the caller appends to;
* decoder cross-attention: keys/values come from the ``CrossKV`` projected once per audio window.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


class AttentionKernel(Protocol):
    """Another way to compute ``attend`` for the shapes it ``accepts`` (``attend_through``): the int8
    type's decoder-step kernel (``cpu/attend.py``), its encoder's ``HeadByHeadAttention``."""

    def accepts(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_offset: int | None
    ) -> bool: ...

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class MultiHeadAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)  # Whisper's key projection has no bias
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)
        #: query|key|value as one projection (set by ``fuse_qkv``): one weight read instead of three
        self.qkv: Callable[[torch.Tensor], torch.Tensor] | None = None
        #: what built ``qkv`` (``fuse_qkv``'s ``make_linear``): to build it again after a move
        self._make_qkv: Callable | None = None
        #: the int8 type's attention for this layer's shapes (``AttentionKernel``), or None: SDPA only
        self.kernel: AttentionKernel | None = None

    def fuse_qkv(
        self,
        make_linear: Callable[[torch.Tensor, torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]
        | None = None,
    ) -> None:
        """Project queries, keys and values with one matrix: one matmul per step instead of three.

        The fused output splits into exactly what the three layers give (the key has no bias; a zero
        one adds nothing), bit for bit. The three layers keep working as views into the fused matrix,
        so no weight is held twice and the state dict keeps its names. ``make_linear(weight, bias)``
        builds the fused layer another way (int8 quantisation).
        """
        n = self.query.weight.shape[0]
        weight, bias = self.qkv_parameters()
        self.query.weight, self.key.weight, self.value.weight = (
            nn.Parameter(w, requires_grad=False) for w in weight.split(n)
        )
        self.query.bias = nn.Parameter(bias[:n], requires_grad=False)
        self.value.bias = nn.Parameter(bias[2 * n :], requires_grad=False)
        self._make_qkv = make_linear
        if make_linear is None:
            self.qkv = functools.partial(F.linear, weight=weight, bias=bias)
        else:
            self.qkv = make_linear(weight, bias)

    def qkv_parameters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The query|key|value weights as one [3d, d] matrix and their biases as one vector (the key has
        no bias: zeros there), new tensors: what ``fuse_qkv`` and the encoder's AMX tiles
        (``cpu/tiled_linear.py``) build their one projection from."""
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight]).detach()
        bias = torch.cat([self.query.bias, torch.zeros_like(self.query.bias), self.value.bias]).detach()
        return weight, bias

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - nn.Module's signature
        """After ``.to()`` / ``.half()`` the three layers hold new tensors: fuse them again, as the same
        kind of projection where that kind says it can be rebuilt (``rebuilds_after_move``: a decoder's
        row GEMMs, whose weight the step rows kernel reads, stay so; int8 ones are not moved)."""
        super()._apply(fn, recurse)
        make = self._make_qkv
        if self.qkv is not None and (make is None or getattr(make, "rebuilds_after_move", False)):
            self.fuse_qkv(make)
        return self

    def project_qkv(
        self, x: torch.Tensor, sizes: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [B, T, d] and head-split keys/values [B, H, T, d/H] (views) of ``x`` [B, T, d].

        ``sizes``: how a decoder step's rows group into caches (``cpu/row_gemm.py``).
        """
        if self.qkv is None:
            q, k, v = self.query(x), self.key(x), self.value(x)
        else:
            q, k, v = linear_rows(self.qkv, x, sizes).chunk(3, dim=-1)
        return q, heads(k, self.n_head), heads(v, self.n_head)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``x`` [B, T, d], split into heads: [B, H, T, d/H], contiguous.

        Caches hold them in this layout so every read is a plain view, never a per-step copy.
        Linears held in bfloat16 (the int8 type's Cross-KV projection, ``cpu/quantize.py``) take
        ``x`` cast to it (a float32 model's float16-held linears widen their weight instead).
        """
        weight = getattr(self.key, "weight", None)
        if weight is not None and weight.dtype == torch.bfloat16 != x.dtype:
            x = x.to(torch.bfloat16)
        return split_heads(self.key(x), self.n_head), split_heads(self.value(x), self.n_head)

    def forward(
        self,
        x: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        causal_offset: int | None = None,
    ) -> torch.Tensor:
        """Attend the queries of ``x`` [B, Tq, d] over ``key``/``value`` [Bk, H, Tk, d/H].

        ``causal_offset``: when given, query i sits at position ``causal_offset + i`` and may only see
        keys at positions ≤ its own (decoder self-attention). When ``B`` is a multiple of ``Bk`` the
        rows are beams sharing one audio window: their queries are grouped, not the keys copied.
        """
        return self.attend(self.query(x), key, value, causal_offset)

    def attend(
        self, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal_offset: int | None = None
    ) -> torch.Tensor:
        """Like ``forward``, for queries [B, Tq, d] already projected (by ``project_qkv``)."""
        return self.out(self.attention(q, key, value, causal_offset))

    def attention(
        self, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal_offset: int | None = None
    ) -> torch.Tensor:
        """``attend`` (no output projection), through this layer's kernel where it has one and the
        kernel takes the shapes (one new position per row: a decoder step)."""
        return attend_through(self.kernel, q, key, value, causal_offset)

    def weights(self, x: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """Softmax attention weights [B, H, Tq, Tk] (no mask): what word alignment reads."""
        q = split_heads(self.query(x), self.n_head)
        if key.shape[0] != q.shape[0]:
            key = key.repeat_interleave(q.shape[0] // key.shape[0], dim=0)
        scale = q.shape[-1] ** -0.5
        return torch.softmax((q @ key.to(q.dtype).transpose(-1, -2)).float() * scale, dim=-1)


def heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """[B, T, d] → [B, H, T, d/H], a view."""
    b, t, d = x.shape
    return x.view(b, t, n_head, d // n_head).transpose(1, 2)


def split_heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """[B, T, d] → [B, H, T, d/H], contiguous."""
    return heads(x, n_head).contiguous()


def attend_through(
    kernel: AttentionKernel | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal_offset: int | None = None,
) -> torch.Tensor:
    """``attend``, through ``kernel`` where there is one and it takes the shapes (a decoder step)."""
    if kernel is not None and kernel.accepts(q, k, v, causal_offset):
        return kernel(q, k, v)
    return attend(q, k, v, causal_offset)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_offset: int | None = None
) -> torch.Tensor:
    """Scaled dot-product attention of queries [B, Tq, d] over head-split keys/values; returns [B, Tq, d].

    Keys/values held in another dtype than the queries (bfloat16 caches of the int8 type) are read
    as they are: the queries are cast to them, the output back.
    """
    out_dtype = q.dtype
    q = q.to(k.dtype)
    b, tq, d = q.shape
    bk, n_head, tk, _ = k.shape
    group = b // bk
    if group != 1:
        if b % bk or causal_offset is not None:
            raise ValueError(f"cannot attend {b} query rows over {bk} key rows")
        # Beams of one window: fold them into the query axis; cross-attention has no mask.
        q = q.reshape(bk, group * tq, d)
    mask = None
    if causal_offset is not None and tq > 1:
        positions = torch.arange(tq, device=q.device)[:, None] + causal_offset
        mask = torch.arange(tk, device=q.device)[None, :] <= positions
    qh = q.view(bk, group * tq, n_head, d // n_head).transpose(1, 2)
    out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask)
    return out.transpose(1, 2).reshape(b, tq, d).to(out_dtype)


def linear_rows(layer: object, x: torch.Tensor, sizes: list[int] | None) -> torch.Tensor:
    """``layer(x)``, telling layers that group a step's rows by cache (``groups_rows``: the CPU
    backend's row GEMMs and int8 linears) how the rows are grouped; other layers ignore it."""
    if sizes is not None and getattr(layer, "groups_rows", False):
        return layer(x, sizes)
    return layer(x)  # type: ignore[operator]
