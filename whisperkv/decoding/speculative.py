"""Exact speculative greedy decoding: the int8 draft guesses, the float32 step checks the guesses.

One greedy window at temperature 0. Before each step the draft (``model/draft.py``) guesses the k
tokens after the one the step is about to choose (k = ``DraftDecoder.per_step``). The step then runs
k + 1 rows of the window's own cache (``TextDecoder.forward_rows``: a cache in consecutive groups takes
consecutive positions):

    row 0: the last chosen token at position p      → logits for position p + 1 (the step's token)
    row j: the draft's guess j at position p + j    → logits for position p + j + 1

Row 0 is exactly a lone step's row: the GEMMs run 2–3 columns wide either way (a lone row is padded
with a zero row; any row of such a chunk gets the same bits, ``model/row_gemm.py``), and attention runs
per row with a lone step's shapes. Row j is exactly the row a later lone step would compute — if
guesses 1..j are the tokens the rows before it choose. So the window takes row 0's token, then row j's
while guess j was the token just taken, each through its filters and search in order (the same
log-probabilities, added in the same order); the positions of guesses not taken are dropped from the
Self-KV. Tokens, scores and caches are the plain loop's, bit for bit; only the number of float32 steps
changes. Through the float32 block step (``wkv_block_step_chain``, round 16) the k + 1 rows of a check
are one C call per block, and their cross-attention one call over the Cross-KV (each query's numbers
its own in that kernel: tested against lone steps, bit for bit); a 3-row check 9.4 → 4.5 ms (scratch).

Measured here (``benchmarks/speculative.py``, RESULTS round 5): the draft is right on 92–98 % of its
guesses, so float32 steps halve (k = 1) or fall to a third (k = 2) — but a guess costs 4.1 ms (5.2 ms in
the engine, with its filters: the draft's ~100 small ops are as dispatch-bound, and its reads of the
Cross-KV and int8 table as cold, as the float32 step's), and a checked row ~0.7 ms plus its token
choice. Whole runs took 0.98–1.03 of the plain loop's time on tiny.en, 0.92–0.99 on base. Round 16
(both halves in C): a guess still costs about a float32 step in a transcription (its 37 MB read cold
each time), so whole runs take 1.13–1.27 of the plain loop's time (the plain loop got faster since
round 5, by more). Off by default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from whisperkv.decoding.search import argmax_rows

if TYPE_CHECKING:
    from whisperkv.cache.kv import DecoderCache
    from whisperkv.decoding.logit_filters import LogitFilter
    from whisperkv.model.draft import DraftDecoder


class DraftGuesses:
    """The draft's side of one window: its Self-KV, the chosen tokens it has not read yet, counts."""

    def __init__(
        self, draft: DraftDecoder, cache: DecoderCache, filters: list[LogitFilter], eot: int
    ) -> None:
        self.draft = draft
        self.eot = eot
        self.cache = draft.new_cache(cache.cross_kv)
        self.filters = filters
        self.fed = 0  # how many of the window's tokens the draft's Self-KV holds
        self._base = 0  # the window's length when the last guesses were made
        self.guessed = 0
        self.accepted = 0

    @property
    def per_step(self) -> int:
        """Guesses a float32 step checks: the draft's setting, read at each step."""
        return self.draft.per_step

    def guess(self, tokens: torch.Tensor, room: int) -> list[int]:
        """Up to ``room`` guessed tokens after the window's ``tokens`` [1, T], each filtered as the
        window filters it after the tokens before it; none after a guessed end of text.

        The draft first reads the tokens it has not read yet (the prompt at first, then what the last
        step chose) in one call."""
        guesses: list[int] = []
        if room <= 0:
            return guesses
        self._base = tokens.shape[1]
        new = tokens[:, self.fed :]
        for _ in range(room):
            logits = self.draft.logits(new, self.cache)[None]
            for f in self.filters:
                f.apply(logits, tokens)
            guess = int(argmax_rows(logits)[0])
            guesses.append(guess)
            if guess == self.eot:
                break
            new = torch.tensor([[guess]])
            tokens = torch.cat([tokens, new], dim=-1)
        # the draft's Self-KV now holds the window's tokens and every guess but the last
        self.fed = self.cache.offset
        self.guessed += len(guesses)
        return guesses

    def took(self, taken: int) -> None:
        """How many of the last guesses were the tokens the float32 rows chose: the draft's Self-KV
        keeps those, and drops the positions of the others."""
        self.accepted += taken
        self.fed = min(self.fed, self._base + taken)
        self.cache.truncate(self.fed)

    def release(self) -> None:
        self.cache = None  # type: ignore[assignment]
