"""TextDecoder: tokens + audio features → next-token logits.

Each block: masked self-attention (keys/values in the layer's ``SelfKV``) → cross-attention (keys/values
in the layer's ``CrossKV``) → GELU MLP, each pre-LayerNormed with a residual. Logits are tied to the
token embedding.

Two ways to run it, which must give the same tokens:
* ``forward(tokens, cache)`` — the fast path: feed only the new tokens; the caches hold the rest.
* ``forward_uncached(tokens, audio_features)`` — the reference twin: recompute the whole prefix and
  every cross-attention projection from scratch, with no cache at all.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from whisperkv.cache.kv import CrossKV, DecoderCache, SelfKV
from whisperkv.cache.provenance import CrossKVProvenance, EncoderProvenance
from whisperkv.model.attention import AttentionKernel, MultiHeadAttention, linear_rows
from whisperkv.model.encoder import mlp


class StepPlan(Protocol):
    """How a backend runs the decoder's steps, chosen once at load (the CPU's: ``cpu/plan.py``).

    Each method returns None where the plan does not take the rows (another dtype or device, a shape
    its kernels do not cover): the decoder then runs its own PyTorch below, the reference every plan
    is proven against. A decoder without a plan runs only that."""

    def block(
        self,
        block: DecoderBlock,
        x: torch.Tensor,
        sizes: list[int],
        self_kvs: list[SelfKV],
        cross_kvs: list[CrossKV],
    ) -> torch.Tensor | None:
        """``block.forward_rows`` (or ``forward``: ``x`` [B, T, d] of one cache)."""

    def step(self, decoder: TextDecoder, tokens: torch.Tensor, cache: DecoderCache) -> torch.Tensor | None:
        """A whole step's logits for one cache's new tokens [rows, 1]."""

    def logits(self, decoder: TextDecoder, x: torch.Tensor, sizes: list[int] | None) -> torch.Tensor | None:
        """The final LayerNorm and the vocabulary projection of rows ``x``."""

    def reorder(self, self_kvs: list[SelfKV], moves: list[tuple[int, int]]) -> bool:
        """Every layer's Self-KV rows follow ``moves`` in one go; False: not taken (layer by layer)."""

    def forget(self, decoder: TextDecoder) -> None:
        """The decoder's tensors are about to be replaced (``.to()``): drop what points at them."""


class DecoderBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int) -> None:
        super().__init__()
        self.attn_ln = nn.LayerNorm(n_state)
        self.attn = MultiHeadAttention(n_state, n_head)
        self.cross_attn_ln = nn.LayerNorm(n_state)
        self.cross_attn = MultiHeadAttention(n_state, n_head)
        self.mlp_ln = nn.LayerNorm(n_state)
        self.mlp = mlp(n_state)

    def forward(
        self,
        x: torch.Tensor,
        self_kv: SelfKV,
        cross_kv: CrossKV,
        collect_weights: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        offset = self_kv.length
        q, k, v = self.attn.project_qkv(self.attn_ln(x))
        self_kv.append(k, v)  # the Self-KV grows by the new positions, in place
        x = x + self.attn.attend(q, self_kv.key, self_kv.value, causal_offset=offset)
        h = self.cross_attn_ln(x)
        if collect_weights is not None:
            collect_weights.append(self.cross_attn.weights(h, cross_kv.key))
        x = x + self.cross_attn(h, cross_kv.key, cross_kv.value)
        return x + self.mlp(self.mlp_ln(x))

    def forward_rows(
        self, x: torch.Tensor, sizes: list[int], self_kvs: list[SelfKV], cross_kvs: list[CrossKV]
    ) -> torch.Tensor:
        """One new position for rows of several caches: ``x`` [N, 1, d], cache i owning ``sizes[i]`` rows.

        The linears and the MLP run once over all N rows (``linear_rows``: layers that group rows by
        cache keep each cache's numbers its own); attention runs per cache, each over its own Self-KV
        length and its own window's Cross-KV, with the shapes a lone decode of that cache uses.
        """
        q, k, v = self.attn.project_qkv(self.attn_ln(x), sizes)
        x = x + linear_rows(self.attn.out, self.attend_self(q, k, v, sizes, self_kvs), sizes)
        q = linear_rows(self.cross_attn.query, self.cross_attn_ln(x), sizes)
        x = x + linear_rows(self.cross_attn.out, self.attend_cross(q, sizes, cross_kvs), sizes)
        up, activation, down = self.mlp
        return x + linear_rows(down, activation(linear_rows(up, self.mlp_ln(x), sizes)), sizes)

    def attend_self(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sizes: list[int], self_kvs: list[SelfKV]
    ) -> torch.Tensor:
        """Each cache's rows: their keys/values appended to its Self-KV, then attended over it [N, T, d]."""
        outs, start = [], 0
        for size, self_kv in zip(sizes, self_kvs, strict=True):
            rows = slice(start, start + size)
            offset = self_kv.length
            self_kv.append(k[rows], v[rows])
            outs.append(self.attn.attention(q[rows], self_kv.key, self_kv.value, causal_offset=offset))
            start += size
        return outs[0] if len(outs) == 1 else torch.cat(outs)  # one cache: no copy

    def attend_cross(self, q: torch.Tensor, sizes: list[int], cross_kvs: list[CrossKV]) -> torch.Tensor:
        """Each cache's rows attended over its window's Cross-KV [N, T, d]."""
        outs, start = [], 0
        for size, cross_kv in zip(sizes, cross_kvs, strict=True):
            outs.append(self.cross_attn.attention(q[start : start + size], cross_kv.key, cross_kv.value))
            start += size
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def step_linears(self) -> tuple:
        """The six products a decoder step makes, in order: the fused query|key|value (None until
        ``MultiHeadAttention.fuse_qkv``), self-attention's output, cross-attention's query and output,
        the MLP's two. What a backend routes or stores for the steps (``cpu/step_rows.py``)."""
        attn, cross = self.attn, self.cross_attn
        return (attn.qkv, attn.out, cross.query, cross.out, self.mlp[0], self.mlp[2])

    def forward_uncached(self, x: torch.Tensor, audio_features: torch.Tensor) -> torch.Tensor:
        h = self.attn_ln(x)
        k, v = self.attn.project_kv(h)
        x = x + self.attn(h, k, v, causal_offset=0)
        ck, cv = self.cross_attn.project_kv(audio_features)  # recomputed on purpose
        x = x + self.cross_attn(self.cross_attn_ln(x), ck, cv)
        return x + self.mlp(self.mlp_ln(x))


def _positions(groups: list[tuple[torch.Tensor, DecoderCache]]) -> list[int]:
    """The position each group's rows take: their cache's next one, or the one after the position an
    earlier group of the same cache takes in this step."""
    taken: dict[int, int] = {}
    positions = []
    for _, cache in groups:
        ahead = taken.get(id(cache), 0)
        positions.append(cache.offset + ahead)
        taken[id(cache)] = ahead + 1
    return positions


class TextDecoder(nn.Module):
    def __init__(self, n_vocab: int, n_ctx: int, n_state: int, n_head: int, n_layer: int) -> None:
        super().__init__()
        # perf: no random init (weights are always loaded); on the meta device it imports sympy, +80 MB RSS
        self.token_embedding = nn.Embedding(n_vocab, n_state, _weight=torch.empty(n_vocab, n_state))
        self.positional_embedding = nn.Parameter(torch.empty(n_ctx, n_state))
        self.blocks = nn.ModuleList(DecoderBlock(n_state, n_head) for _ in range(n_layer))
        self.ln = nn.LayerNorm(n_state)
        #: set by int8 quantisation; otherwise logits use the token embedding directly (tied weights)
        self.logits_projection: nn.Module | None = None
        #: dtype the Self-KV and Cross-KV are held in; None means the weights' dtype
        self.kv_dtype: torch.dtype | None = None
        #: how a backend runs the steps (``StepPlan``, set at load), or None: the PyTorch here only
        self.plan: StepPlan | None = None

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - nn.Module's signature
        """After ``.to()`` / ``.float()`` the decoder holds new tensors: the plan lets go of the old."""
        if self.plan is not None:
            self.plan.forget(self)
        return super()._apply(fn, recurse)

    @property
    def attention_kernel(self) -> AttentionKernel | None:
        """The kernel the blocks' steps attend through, read from the blocks themselves; None: SDPA."""
        return self.blocks[0].cross_attn.kernel if len(self.blocks) else None

    @property
    def n_ctx(self) -> int:
        return self.positional_embedding.shape[0]

    def project_cross_kv(
        self, audio_features: torch.Tensor, encoder_provenance: EncoderProvenance
    ) -> list[CrossKV]:
        """Every layer's Cross-KV for one encoder output: projected once, then only read."""
        return [
            CrossKV(
                *self._cross_keys(block.cross_attn, audio_features), CrossKVProvenance(encoder_provenance, i)
            )
            for i, block in enumerate(self.blocks)
        ]

    @torch.no_grad()
    def _cross_keys(
        self, attention: MultiHeadAttention, audio_features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's cross-attention keys and values of the encoder output, held in ``kv_dtype``
        (bfloat16 for the int8 type). A batch of windows is projected one window at a time on the CPU:
        an int8 projection of 16 windows at once was 3x slower than 16 single ones (activations far
        outside the caches)."""
        dtype = self.kv_dtype or audio_features.dtype
        if audio_features.shape[0] > 1 and audio_features.device.type == "cpu":
            parts = [[t.to(dtype) for t in attention.project_kv(row)] for row in audio_features.split(1)]
            return torch.cat([k for k, _ in parts]), torch.cat([v for _, v in parts])
        key, value = attention.project_kv(audio_features)
        return key.to(dtype), value.to(dtype)

    def new_cache(self, cross_kv: list[CrossKV], batch_size: int | None = None) -> DecoderCache:
        """An empty Self-KV per layer beside the given Cross-KV.

        ``batch_size`` may be a multiple of the audio batch (beams, best-of samples of one window);
        the Cross-KV keeps the audio batch and is shared by those rows, not copied.
        """
        key = cross_kv[0].key  # [B, H, T, d/H]
        rows = batch_size or key.shape[0]
        width = self.positional_embedding.shape[1]
        selfs = [
            SelfKV(i, rows, self.n_ctx, width, key.dtype, key.device, n_head=key.shape[1])
            for i in range(len(self.blocks))
        ]
        return DecoderCache(selfs, cross_kv, self.plan.reorder if self.plan is not None else None)

    def _embed(self, tokens: torch.Tensor, offset: int) -> torch.Tensor:
        end = offset + tokens.shape[-1]
        if end > self.n_ctx:
            raise ValueError(f"text context is {self.n_ctx} tokens; position {end - 1} is past it")
        weight = getattr(self.token_embedding, "weight", None)  # the int8 type's table has none
        positions = self.positional_embedding[offset:end]
        if weight is not None and weight.dtype == torch.float16 and positions.dtype == torch.float32:
            # the float16 copy of a float16-valued table, widened exactly inside the add: one operation
            # where there were three (each costs tens of µs inside a decoding step)
            return torch.add(F.embedding(tokens, weight), positions)
        embedded = self.token_embedding(tokens)
        return embedded + positions.to(embedded.dtype)

    def _logits(self, x: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
        if self.plan is not None:
            logits = self.plan.logits(self, x, sizes)
            if logits is not None:
                return logits
        return self.project(self.ln(x), sizes)

    def _block(
        self,
        i: int,
        x: torch.Tensor,
        sizes: list[int] | None,
        self_kvs: list[SelfKV],
        cross_kvs: list[CrossKV],
    ) -> torch.Tensor:
        """Block ``i`` on rows ``x``: through the plan where it takes them, else the block's PyTorch
        (``sizes`` None: ``x`` [B, T, d] of one cache, ``DecoderBlock.forward``)."""
        block = self.blocks[i]
        if self.plan is not None:
            out = self.plan.block(block, x, sizes or [x.shape[0]], self_kvs, cross_kvs)
            if out is not None:
                return out
        if sizes is None:
            return block(x, self_kvs[0], cross_kvs[0])
        return block.forward_rows(x, sizes, self_kvs, cross_kvs)

    def project(self, hidden: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
        """Logits of rows already through the final LayerNorm: the tied vocabulary projection."""
        if self.logits_projection is not None:
            return linear_rows(self.logits_projection, hidden, sizes).float()
        return (hidden @ self.token_embedding.weight.to(hidden.dtype).T).float()

    def forward(
        self, tokens: torch.Tensor, cache: DecoderCache, positions: list[int] | None = None
    ) -> torch.Tensor:
        """Logits [B, T, vocab] for the new ``tokens`` [B, T]; appends them to the Self-KV.

        ``positions`` (indices into the new tokens) limits the vocabulary projection — the largest
        matrix of a small model — to the rows the caller reads, e.g. only the last one of a long prompt.
        """
        x = self._embed(tokens, cache.offset)
        for i, (self_kv, cross_kv) in enumerate(zip(cache.self_kv, cache.cross_kv, strict=True)):
            x = self._block(i, x, None, [self_kv], [cross_kv])
        cache.record_tokens(tokens)
        if positions is not None:
            x = x[:, positions]
        return self._logits(x)

    def forward_rows(self, groups: list[tuple[torch.Tensor, DecoderCache]]) -> torch.Tensor:
        """One decoder step for several caches at once: logits [sum of rows, vocab], cache by cache.

        ``groups`` pairs each cache with its rows' next tokens [rows, 1]. Each row is embedded at its
        own cache's position (a cache in several consecutive groups takes that many consecutive
        positions, in order); attention stays within each cache (see ``DecoderBlock.forward_rows``);
        every linear, the MLP and the vocabulary projection run once for all rows, cut along the
        caches' row groups (``linear_rows``) so that no row's numbers depend on the other caches in
        the step. One cache: the plan's whole step, where it has one.
        """
        if len(groups) == 1 and self.plan is not None:
            logits = self.plan.step(self, *groups[0])
            if logits is not None:
                return logits
        sizes = [tokens.shape[0] for tokens, _ in groups]
        positions = _positions(groups)
        x = torch.cat([self._embed(tokens, at) for (tokens, _), at in zip(groups, positions, strict=True)])
        for i in range(len(self.blocks)):
            x = self._block(
                i,
                x,
                sizes,
                [cache.self_kv[i] for _, cache in groups],
                [cache.cross_kv[i] for _, cache in groups],
            )
        for tokens, cache in groups:
            cache.record_tokens(tokens)
        return self._logits(x, sizes)[:, -1]

    def forward_uncached(self, tokens: torch.Tensor, audio_features: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] for the whole sequence ``tokens``, recomputing everything."""
        x = self._embed(tokens, 0)
        for block in self.blocks:
            x = block.forward_uncached(x, audio_features)
        return self._logits(x)

    def cross_attention_weights(
        self, tokens: torch.Tensor, cross_kv: list[CrossKV]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits and every layer's cross-attention weights [B, H, T, 1500] for a whole sequence.

        Word timing reads the alignment heads from these. The window's Cross-KV is reused; a fresh
        Self-KV is built because this is a new sequence (the decoded text, closed by end of text).
        """
        cache = self.new_cache(cross_kv, batch_size=tokens.shape[0])
        weights: list[torch.Tensor] = []
        x = self._embed(tokens, 0)
        for block, self_kv, kv in zip(self.blocks, cache.self_kv, cache.cross_kv):
            x = block(x, self_kv, kv, collect_weights=weights)
        return self._logits(x), weights
