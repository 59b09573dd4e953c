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

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from whisperkv.cache.kv import CrossKV, DecoderCache, SelfKV
from whisperkv.cache.provenance import CrossKVProvenance, EncoderProvenance
from whisperkv.model.attention import AttentionKernel, MultiHeadAttention, heads
from whisperkv.model.encoder import mlp
from whisperkv.model.int8_step import Int8StepRows
from whisperkv.model.row_gemm import linear_rows
from whisperkv.model.vocab import ChunkedRowProjection
from whisperkv.model.vocab_screen import VocabScreen

if TYPE_CHECKING:
    from whisperkv.model.block_step import BlockStep
    from whisperkv.model.decoder_step import DecoderStep
    from whisperkv.model.draft import DraftDecoder
    from whisperkv.model.step_rows import StepRowsKernel


class DecoderBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int) -> None:
        super().__init__()
        self.attn_ln = nn.LayerNorm(n_state)
        self.attn = MultiHeadAttention(n_state, n_head)
        self.cross_attn_ln = nn.LayerNorm(n_state)
        self.cross_attn = MultiHeadAttention(n_state, n_head)
        self.mlp_ln = nn.LayerNorm(n_state)
        self.mlp = mlp(n_state)
        #: CPU steps' linears in one C call each (float32: ``model/step_rows.py``; int8:
        #: ``model/int8_step.py``), or None: row GEMMs (float32), PyTorch between the kernels (int8)
        self.step_rows: StepRowsKernel | Int8StepRows | None = None
        #: with ``step_rows``: one cache's step of the whole block in one C call (``model/block_step.py``)
        self.block_step: BlockStep | None = None

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - nn.Module's signature
        """After ``.to()`` / ``.float()`` the block holds new tensors: the one-call step's struct of
        pointers to the old ones goes."""
        if self.block_step is not None:
            self.block_step.forget(self)
        return super()._apply(fn, recurse)

    def forward(
        self,
        x: torch.Tensor,
        self_kv: SelfKV,
        cross_kv: CrossKV,
        collect_weights: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if self._kernel_takes(x) and collect_weights is None:  # a prompt, or a per-step loop's step
            return self._forward_rows_kernel(x, [x.shape[0]], [self_kv], [cross_kv])
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

        The linears and the MLP run once over all N rows; attention runs per cache, each over its own
        Self-KV length and its own window's Cross-KV, with the shapes a lone decode of that cache uses.
        Through ``step_rows`` (each linear with its LayerNorm, bias, GELU and residual in one C call)
        where the block has it; else through the row GEMMs (float32) or PyTorch's operations between the
        int8 kernels (int8): its slow twin.
        """
        if self._kernel_takes(x):
            return self._forward_rows_kernel(x, sizes, self_kvs, cross_kvs)
        q, k, v = self.attn.project_qkv(self.attn_ln(x), sizes)
        x = x + linear_rows(self.attn.out, self._self_attention(q, k, v, sizes, self_kvs), sizes)
        q = linear_rows(self.cross_attn.query, self.cross_attn_ln(x), sizes)
        x = x + linear_rows(self.cross_attn.out, self._cross_attention(q, sizes, cross_kvs), sizes)
        up, activation, down = self.mlp
        return x + linear_rows(down, activation(linear_rows(up, self.mlp_ln(x), sizes)), sizes)

    def _kernel_takes(self, x: torch.Tensor) -> bool:
        """Whether this block's linears run through ``step_rows`` for ``x``: float32 CPU rows (a model
        moved to another dtype or device after loading keeps PyTorch's paths)."""
        return self.step_rows is not None and x.dtype == torch.float32 and x.device.type == "cpu"

    def _forward_rows_kernel(
        self, x: torch.Tensor, sizes: list[int], self_kvs: list[SelfKV], cross_kvs: list[CrossKV]
    ) -> torch.Tensor:
        """``forward_rows`` (or ``forward``: ``x`` [B, T, d], one cache) with six C calls for the
        linears (``model/step_rows.py``), each over all B x T positions as rows."""
        step = self.block_step
        if step is not None and step.takes(self, x, sizes, self_kvs[0], cross_kvs[0]):
            return step(self, x, self_kvs[0], cross_kvs[0])  # the same calls, from C
        if step is not None and step.takes_chain(self, x, sizes, self_kvs, cross_kvs):
            return step(self, x, self_kvs[0], cross_kvs[0], chain=True)  # a speculative check, from C
        rows, (b, t, d) = self.step_rows, x.shape
        x = x.reshape(b * t, d)
        qkv = rows.through(x, self.attn.qkv, norm=self.attn_ln).view(b, t, 3 * d)
        n_head = self.attn.n_head
        q, k, v = qkv[..., :d], heads(qkv[..., d : 2 * d], n_head), heads(qkv[..., 2 * d :], n_head)
        out = self.attn.out
        attended = self._self_attention(q, k, v, sizes, self_kvs).reshape(b * t, d)
        x = rows.through(attended, out, residual=x)
        query, out = self.cross_attn.query, self.cross_attn.out
        q = rows.through(x, query, norm=self.cross_attn_ln).view(b, t, d)
        attended = self._cross_attention(q, sizes, cross_kvs).reshape(b * t, d)
        x = rows.through(attended, out, residual=x)
        up, _, down = self.mlp
        hidden = rows.through(x, up, norm=self.mlp_ln, gelu=True)
        return rows.through(hidden, down, residual=x).view(b, t, d)

    def _self_attention(
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

    def _cross_attention(self, q: torch.Tensor, sizes: list[int], cross_kvs: list[CrossKV]) -> torch.Tensor:
        """Each cache's rows attended over its window's Cross-KV [N, T, d]."""
        outs, start = [], 0
        for size, cross_kv in zip(sizes, cross_kvs, strict=True):
            outs.append(self.cross_attn.attention(q[start : start + size], cross_kv.key, cross_kv.value))
            start += size
        return outs[0] if len(outs) == 1 else torch.cat(outs)

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
        #: the int8 screen of the float32 table greedy steps use (``model/vocab_screen.py``), or None
        self.vocab_screen: VocabScreen | None = None
        #: the int8 draft whose guesses greedy steps check two at a time (``model/draft.py``), or None
        self.draft: DraftDecoder | None = None
        #: with the blocks' one-call steps: a whole step of one cache in one C call
        #: (``model/decoder_step.py``), or None
        self.decoder_step: DecoderStep | None = None

    @property
    def attention_kernel(self) -> AttentionKernel | None:
        """The kernel the blocks' steps attend through (the int8 type's, ``model/attend_kernel.py``), read
        from the blocks themselves; None: SDPA."""
        return self.blocks[0].cross_attn.kernel if len(self.blocks) else None

    @property
    def n_ctx(self) -> int:
        return self.positional_embedding.shape[0]

    def project_cross_kv(
        self, audio_features: torch.Tensor, encoder_provenance: EncoderProvenance
    ) -> list[CrossKV]:
        """Every layer's Cross-KV for one encoder output: projected once, then only read."""
        return [
            CrossKV.project(
                block.cross_attn, audio_features, CrossKVProvenance(encoder_provenance, i), self.kv_dtype
            )
            for i, block in enumerate(self.blocks)
        ]

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
        return DecoderCache(selfs, cross_kv)

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
        kernel = self._norm_kernel(x)
        if kernel is None:
            return self.project(self.ln(x), sizes)
        # the LayerNorm inside the projection's call, as the one-call step makes it
        if isinstance(self.logits_projection, ChunkedRowProjection):
            return self.logits_projection(x, sizes, norm=self.ln)
        rows = x.reshape(-1, x.shape[-1])  # the int8 type's vocabulary through its linears' kernel
        return kernel.through(rows, self.logits_projection, norm=self.ln).view(*x.shape[:-1], -1)

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final LayerNorm of rows ``x``: the step kernel's where it projects them (the bits ``_logits``
        and the one-call step project), else PyTorch's."""
        kernel = self._norm_kernel(x)
        return kernel.layer_norm(x, self.ln) if kernel is not None else self.ln(x)

    def _norm_kernel(self, x: torch.Tensor) -> StepRowsKernel | Int8StepRows | None:
        """The step's linears kernel where it projects rows ``x`` (float32 CPU rows): then it also
        normalises them, with the LayerNorm it gives every block's linears. None: PyTorch's LayerNorm."""
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return None
        projection = self.logits_projection
        if isinstance(projection, ChunkedRowProjection):
            return projection.kernel
        rows = self.blocks[0].step_rows if len(self.blocks) else None
        return rows if isinstance(rows, Int8StepRows) and rows.takes(projection) else None

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
        for block, self_kv, cross_kv in zip(self.blocks, cache.self_kv, cache.cross_kv):
            x = block(x, self_kv, cross_kv)
        cache.record_tokens(tokens)
        if positions is not None:
            x = x[:, positions]
        return self._logits(x)

    def forward_rows(
        self, groups: list[tuple[torch.Tensor, DecoderCache]], project: bool = True
    ) -> torch.Tensor:
        """One decoder step for several caches at once: logits [sum of rows, vocab], cache by cache.

        ``project=False`` returns the rows before the vocabulary projection, after the final LayerNorm
        ([sum of rows, d]): a caller that screens the vocabulary (``model/vocab_screen.py``) projects
        only the rows that need every logit, with ``project``.

        ``groups`` pairs each cache with its rows' next tokens [rows, 1]. Each row is embedded at its
        own cache's position (a cache in several consecutive groups takes that many consecutive
        positions, in order: a speculative check, ``decoding/speculative.py``); attention stays within
        each cache (see ``DecoderBlock.forward_rows``);
        every linear, the MLP and the vocabulary projection run once for all rows, as GEMMs cut along
        the caches' row groups (``model/row_gemm.py``) so that no row's numbers depend on the other
        caches in the step.
        """
        if project and len(groups) == 1 and self.decoder_step is not None:  # one cache: one C call
            logits = self.decoder_step.logits(self, *groups[0])
            if logits is not None:
                return logits
        sizes = [tokens.shape[0] for tokens, _ in groups]
        positions = _positions(groups)
        x = torch.cat([self._embed(tokens, at) for (tokens, _), at in zip(groups, positions, strict=True)])
        for i, block in enumerate(self.blocks):
            x = block.forward_rows(
                x,
                sizes,
                [cache.self_kv[i] for _, cache in groups],
                [cache.cross_kv[i] for _, cache in groups],
            )
        for tokens, cache in groups:
            cache.record_tokens(tokens)
        if not project:
            return self._final_norm(x)[:, -1]
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
