"""Greedy steps at temperature 0 that read the int8 screen instead of the float32 vocabulary table.

A greedy step needs three things from the logits, and none of them needs every logit exactly:

* the argmax of the filtered logits: the screen (``model/vocab_screen.py``) proves which tokens can
  hold it, and only those get their exact float32 logits (the full product's bits);
* the timestamp rule (a timestamp is forced when the timestamps' total probability beats every text
  token): ``logsumexp(timestamp logits) > best text logit`` — the normaliser cancels — decided from the
  exact timestamp block (1,501 rows) and the exact best text logit; within a margin of the float
  rounding the step is not decided here: it takes the full product (as when too many tokens remain);
* the chosen token's log-probability, which needs every logit (the normaliser): only its sum over the
  window is ever read, so it is deferred to ``ScreenedGreedy.sum_logprobs``: the window's rows go
  through the table 64 at a time (one read of it for 64 tokens, not one per token), and each step
  replays its own filters on its own row.

Tokens are therefore exactly those of the full step. The summed log-probability is the same sum
computed from a product of another width (it may differ in its last bits); ``exact=True`` recomputes it
with the full step's own chunk widths, bit for bit (the window does so when the value lies near a
threshold a decision compares it with).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from whisperkv.decoding.greedy_choice import GreedyChoice
from whisperkv.decoding.logit_filters import LogitFilter, SuppressBlank, SuppressTokens, TimestampRules
from whisperkv.decoding.search import GreedySearch
from whisperkv.model.vocab import ChunkedRowProjection

if TYPE_CHECKING:
    from whisperkv.model.decoder import TextDecoder
    from whisperkv.model.vocab_screen import ScreenedRows, VocabScreen

NEG_INF = float("-inf")
#: more candidates than this: the screen says little this step, and the full product is cheaper
MAX_CANDIDATES = 2048
#: rows per product of the deferred log-probabilities: wide enough to read the table at GEMM speed,
#: narrow enough that its logits stay small (64 x 51,864 float32: 13 MB)
DEFERRED_ROWS = 64
SCREENABLE_FILTERS = (SuppressBlank, SuppressTokens, TimestampRules)


def can_screen(decoder: TextDecoder, filters: list[LogitFilter]) -> bool:
    """A decoder whose table has a sound screen, and filters whose effect is known from the tokens."""
    screen = decoder.vocab_screen
    return (
        screen is not None
        and isinstance(decoder.logits_projection, ChunkedRowProjection)
        and screen.serves(decoder.token_embedding.weight)
        and all(type(f) in SCREENABLE_FILTERS for f in filters)
    )


class ScreenedGreedy:
    """One greedy row's screened steps: the exact token now, the log-probabilities at the end."""

    def __init__(self, decoder: TextDecoder, filters: list[LogitFilter], eot: int) -> None:
        assert decoder.vocab_screen is not None
        self.decoder = decoder
        self.screen: VocabScreen = decoder.vocab_screen
        self.filters = filters
        self.eot = eot
        rules = [f for f in filters if isinstance(f, TimestampRules)]
        self.ts: int | None = rules[0].ts if rules else None
        self.n_vocab = self.screen.table.shape[0]
        self._mask = torch.zeros(1, self.n_vocab)
        #: per step, in order: (hidden row, token prefix length, timestamp forced?, token, finished?)
        self.records: list[tuple[torch.Tensor, int, bool, int, bool]] = []
        self.fallbacks = 0  # steps the screen could not decide (the full step chose)
        #: the full step's log-probabilities (``decoding/greedy_choice.py``) for the deferred sums
        self.choice = GreedyChoice.for_window(GreedySearch(0.0, eot), filters)

    def choose(self, hidden: torch.Tensor, rows: ScreenedRows, row: int, tokens: torch.Tensor) -> int:
        """The token the full greedy step chooses for one row, given its hidden state [d], the screen's
        answer for the step's rows and this row's index in it, and the row's tokens [1, length]; its
        log-probability is deferred."""
        mask = self._mask.zero_()
        for f in self.filters:
            f.suppress(mask, tokens)
        decided = self._screened_choice(hidden, rows, row)
        if decided is None:
            decided = self._full_choice(hidden, tokens)
        token, force = decided
        finished = int(tokens[0, -1]) == self.eot
        self.records.append((hidden.clone(), tokens.shape[1], force, token, finished))
        return self.eot if finished else token

    def _screened_choice(self, hidden: torch.Tensor, rows: ScreenedRows, row: int) -> tuple[int, bool] | None:
        """(token, timestamp forced?) from the screen, or None where it cannot decide (the filters'
        -inf are in ``self._mask``)."""
        ts = self.ts
        stamps_allowed = ts is not None and float(self._mask[0, ts:].max()) == 0.0
        if not stamps_allowed:  # no timestamp rule in play: the argmax alone
            best = self._best(hidden, rows, row, self.n_vocab)
            return None if best is None or best[1] == NEG_INF else (best[0], False)
        stamps = self.screen.exact_range(hidden, ts, self.n_vocab) + self._mask[0, ts:]
        best = self._best(hidden, rows, row, ts)
        if best is None:
            return None
        text_id, best_text = best
        values = stamps.numpy()  # 1,501 values: NumPy's call costs less than PyTorch's here
        top = values.max()  # finite: some timestamp is allowed
        stamp_mass = float(top + np.log(np.exp(values - top).sum()))
        margin = 1e-3 + 1e-5 * (abs(best_text) + abs(stamp_mass) + 11.0)
        if best_text != NEG_INF and abs(stamp_mass - best_text) <= margin:
            return None  # the rule's float rounding could go either way: the full step decides
        force = stamp_mass > best_text
        stamp_id = int(np.argmax(stamps.numpy()))
        if force or float(stamps[stamp_id]) > best_text:
            return ts + stamp_id, force
        return text_id, force

    def _full_choice(self, hidden: torch.Tensor, tokens: torch.Tensor) -> tuple[int, bool]:
        """(token, timestamp forced?) from every logit: the filters and argmax of the full step."""
        self.fallbacks += 1
        logits = self.decoder.project(hidden[None], [1])
        force = False
        for f in self.filters:
            f.suppress(logits, tokens)
            if isinstance(f, TimestampRules):
                force = bool(f.forced(logits)[0])
        if force:
            logits[:, : self.ts] = NEG_INF
        return int(np.argmax(logits[0].numpy())), force

    def _best(self, hidden: torch.Tensor, rows: ScreenedRows, row: int, n: int) -> tuple[int, float] | None:
        """(id, exact logit) of the first largest allowed logit among the first ``n`` ids, (0, -inf) when
        none is allowed, or None when too many are candidates.

        A token can hold the largest logit only if its upper bound reaches the largest lower bound."""
        ids, floor = self.screen.candidates(rows, row, self._mask[0], n, MAX_CANDIDATES)
        if floor == NEG_INF:
            return 0, NEG_INF
        if ids is None:
            return None
        exact = self.screen.exact(hidden, ids)
        best = int(np.argmax(exact.numpy()))
        return int(ids[best]), float(exact[best])

    def sum_logprobs(self, start: torch.Tensor, tokens: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """The window's summed log-probability [1], as the full greedy steps accumulate it onto ``start``
        (the sum before the first screened step), in the same order.

        The deferred rows go through the table ``DEFERRED_ROWS`` at a time: a product that wide reads
        the table once for all of them, and its logits (13 MB for tiny.en) are all the memory it adds
        (each row is normalised on its own: a normalisation of all of them at once held 13 MB more and
        left the process's peak 10-20 MB higher, measured). Each row is filtered and normalised as its
        full step did. ``exact`` multiplies with the full step's chunk widths (1–3 rows), so every logit
        — and the sum — has the full step's bits; the wide product's logits may differ in their last
        bits (so may the sum).
        """
        total = start.clone()
        for first in range(0, len(self.records), DEFERRED_ROWS):
            records = self.records[first : first + DEFERRED_ROWS]
            hidden = torch.stack([r[0] for r in records])
            if exact:  # the full step's chunk widths: its bits
                logits = self.decoder.project(hidden, [1] * len(records))
            else:  # one GEMM reads the table once for all the rows
                logits = _products(hidden, self.screen.table)
            for row, (_, length, force, token, finished) in zip(logits, records):  # in step order
                row = row[None]  # its own filters, in place
                if self.choice is not None:  # the full step's own filters, choice and log-probability
                    self.choice.update(tokens[:, :length], row, total)
                    continue
                for f in self.filters:
                    f.suppress(row, tokens[:, :length])
                if force:
                    row[:, : self.ts] = NEG_INF
                total += F.log_softmax(row, dim=-1)[:, token] * ~torch.tensor([finished])
        return total


def _products(hidden: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``hidden @ table.T`` [k, V]; a float16 table (``step_rows.half_copy``) widened 4,096 rows at a
    time, so no float32 copy of the whole table is ever made."""
    if table.dtype == hidden.dtype:
        return torch.mm(hidden, table.T)
    out = hidden.new_empty(hidden.shape[0], table.shape[0])
    for start in range(0, table.shape[0], 4096):
        out[:, start : start + 4096] = torch.mm(hidden, table[start : start + 4096].float().T)
    return out
