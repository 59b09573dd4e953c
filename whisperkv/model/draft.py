"""An int8 draft of a float32 decoder: cheap guesses of the next token for exact speculative decoding.

Why: a float32 greedy step reads every weight of the decoder for one token, and its GEMMs already run
two columns wide (``model/row_gemm.py``: a lone row is padded with a zero row). A second real row — a
guess of the token after the one being chosen — therefore rides along for the price of its attention,
and each right guess saves a whole float32 step. The guess has to be cheap and usually right: this
draft runs the same decoder with int8 weights (``model/quantize.py``'s ``Int8Linear``, per-row scales)
and agrees with it on 92–98 % of tokens. It is not cheap enough here: 4.1 ms a guess against 6.6 ms for
a float32 step (caches flushed), so whole runs gain little (RESULTS, round 5; with the int8 type's rows
kernel, 0.91–0.98 of the plain loop's time, round 7). Round 16 put a guess's blocks in C (the int8
type's block step, ``DraftBlockStep``, over a bfloat16 copy of the window's Cross-KV): 4.3 → 2.0 ms a
guess with its weights in cache, 3.5 ms with them evicted (as the float32 check evicts them), still
about a float32 step's cost in a transcription, so still slower than the plain loop (RESULTS, round 16).

The draft never decides a token: ``decoding/speculative.py`` keeps only what the float32 rows choose.

What it shares and what it owns: the float32 decoder's token and position embeddings and its
LayerNorms; it owns int8 copies of the blocks' other linears and of the vocabulary table (tiny.en: 8 +
20 MB) and, per window, its own bfloat16 Self-KV and a bfloat16 copy of the window's Cross-KV (projected
once by the float32 layers, same provenance; tiny.en: 9 MB).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from whisperkv.cache.kv import CrossKV, DecoderCache, SelfKV
from whisperkv.model.attend_kernel import AttendKernel, load_kernel
from whisperkv.model.attention import attend_through, heads
from whisperkv.model.int8_rows import Int8RowsKernel, load_rows_kernel
from whisperkv.model.int8_step import Int8BlockStep, int8_block_parameters
from whisperkv.model.quantize import Int8Linear

if TYPE_CHECKING:
    from whisperkv.model.decoder import DecoderBlock, TextDecoder


@dataclass(frozen=True)
class _DraftBlock:
    """One decoder block's int8 linears beside the float32 block's LayerNorms and activation."""

    source: DecoderBlock
    qkv: Int8Linear
    out: Int8Linear
    cross_query: Int8Linear
    cross_out: Int8Linear
    up: Int8Linear
    down: Int8Linear
    kernel: AttendKernel | None  # the int8 type's step attention (``model/attend_kernel.py``), if built

    @classmethod
    def of(cls, block: DecoderBlock, kernel: AttendKernel | None, rows: Int8RowsKernel | None) -> _DraftBlock:
        attn, cross = block.attn, block.cross_attn
        up, _, down = block.mlp
        return cls(
            block,
            Int8Linear(*attn.qkv_parameters(), rows),
            Int8Linear.from_linear(attn.out, rows),
            Int8Linear.from_linear(cross.query, rows),
            Int8Linear.from_linear(cross.out, rows),
            Int8Linear.from_linear(up, rows),
            Int8Linear.from_linear(down, rows),
            kernel,
        )

    def __call__(self, x: torch.Tensor, self_kv: SelfKV, cross_kv: CrossKV) -> torch.Tensor:
        block, n_head = self.source, self.source.attn.n_head
        offset = self_kv.length
        q, k, v = self.qkv(block.attn_ln(x)).chunk(3, dim=-1)
        self_kv.append(heads(k, n_head), heads(v, n_head))
        x = x + self.out(attend_through(self.kernel, q, self_kv.key, self_kv.value, offset))
        q = self.cross_query(block.cross_attn_ln(x))
        x = x + self.cross_out(attend_through(self.kernel, q, cross_kv.key, cross_kv.value))
        return x + self.down(block.mlp[1](self.up(block.mlp_ln(x))))


#: tokens a guess reads one at a time through the C step (more: the blocks' Python, once)
FEW = 8


class DraftBlockStep(Int8BlockStep):
    """A draft block's one-token step in one C call: the int8 type's block step (bfloat16 caches) with
    the draft's int8 linears and the float32 block's LayerNorms. Why: the draft's Python (about 100
    small operations a guess) cost more than the float32 step it saves (4.3 against 3.5 ms, scratch,
    round 16)."""

    def __reduce__(self) -> tuple:
        return (load_draft_block_step, ())

    def _make(self, block: _DraftBlock) -> tuple[ctypes.Structure | None, list[torch.Tensor]]:  # type: ignore[override]
        source = block.source
        norms = [source.attn_ln, source.cross_attn_ln, source.mlp_ln]
        layers = [block.qkv, block.out, block.cross_query, block.cross_out, block.up, block.down]
        return int8_block_parameters(norms, layers, source.attn.n_head)


def load_draft_block_step() -> DraftBlockStep | None:
    """The draft's block step, from the library ``load_kernel`` builds; None where it cannot be built."""
    built = load_kernel()
    return DraftBlockStep(built.library) if built is not None else None


class DraftDecoder:
    """The int8 draft of one float32 ``TextDecoder`` (a plain object: its tensors are not parameters,
    so the float32 model's state dict and weights digest do not change)."""

    def __init__(self, decoder: TextDecoder, per_step: int = 1) -> None:
        self.decoder = decoder
        #: how many guesses a float32 step checks (each one more row of the step)
        self.per_step = per_step
        with torch.no_grad():
            kernel, rows = load_kernel(), load_rows_kernel()  # the int8 type's own kernels, where built
            self.blocks = [_DraftBlock.of(block, kernel, rows) for block in decoder.blocks]
            self.vocabulary = Int8Linear(decoder.token_embedding.weight, None, rows)
        #: one C call per block for a one-token guess (None: the blocks' Python, as for a prompt)
        self.step = load_draft_block_step() if kernel is not None and rows is not None else None

    @property
    def nbytes(self) -> int:
        """Bytes of int8 weights the draft holds (scales and biases aside)."""
        linears = [
            getattr(b, name)
            for b in self.blocks
            for name in ("qkv", "out", "cross_query", "cross_out", "up", "down")
        ]
        return sum(linear.nbytes for linear in linears) + self.vocabulary.nbytes

    def new_cache(self, cross_kv: list[CrossKV]) -> DecoderCache:
        """An empty one-row bfloat16 Self-KV per layer beside a bfloat16 copy of the float32 window's
        Cross-KV (the same provenance). Why a copy: a guess read the float32 Cross-KV (18 of its 46 MB
        for tiny.en); the copy halves that, made once per window (9 MB for tiny.en)."""
        return self.decoder.new_cache([kv.to(torch.bfloat16) for kv in cross_kv], batch_size=1)

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        """The draft's logits [vocab] after ``tokens`` [1, T], appended to its Self-KV.

        A few tokens (what a step chose after the guesses it took) go one position at a time through
        the C block step; a prompt goes through the blocks' Python at once."""
        x = self.decoder._embed(tokens, cache.offset)
        if self.step is not None and tokens.shape[1] <= FEW:
            x = torch.cat([self._through_c(x[:, i : i + 1], cache) for i in range(tokens.shape[1])], dim=1)
        else:
            for block, self_kv, cross_kv in zip(self.blocks, cache.self_kv, cache.cross_kv, strict=True):
                x = block(x, self_kv, cross_kv)
        cache.record_tokens(tokens)
        return self.vocabulary(self.decoder.ln(x[:, -1:]))[0, 0].float()

    def _through_c(self, x: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        """One position [1, 1, d] through every block: one C call each where the step takes it."""
        step = self.step
        assert step is not None
        for block, self_kv, cross_kv in zip(self.blocks, cache.self_kv, cache.cross_kv, strict=True):
            if step.takes(block, x, [1], self_kv, cross_kv):  # type: ignore[arg-type]
                x = step(block, x, self_kv, cross_kv)  # type: ignore[arg-type]
            else:
                x = block(x, self_kv, cross_kv)
        return x


def can_draft(decoder: nn.Module) -> bool:
    """A float32 CPU decoder whose step rows keep their bits in any 2-column chunk (``rows-gemm``): a
    verified row must equal the row a lone step computes."""
    from whisperkv.model.vocab import ChunkedRowProjection

    weight = decoder.token_embedding.weight
    return (
        isinstance(decoder.logits_projection, ChunkedRowProjection)
        and weight.dtype in (torch.float32, torch.float16)  # float16: the step rows kernel's exact copy
        and weight.device.type == "cpu"
    )
