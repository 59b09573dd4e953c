"""Rules applied to the next-token logits before a token is chosen (all edit in place).

* ``SuppressBlank``  — the first sampled token may be neither a space nor end of text.
* ``SuppressTokens`` — never emit the given ids (non-speech symbols, task/control tokens).
* ``TimestampRules`` — timestamps come in pairs and never go backwards; the first token is a
  timestamp no later than ``max_initial_timestamp``; a timestamp is forced when the timestamps'
  total probability beats every single text token.
* ``hold_end_of_text`` — batched mode only: no end of text while a window's decoded text ends
  before the speech its detector found (``whisperkv.batched``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

NEG_INF = float("-inf")


class LogitFilter:
    def apply(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor | None:
        """``logits`` [rows, vocab] for the next token given ``tokens`` [rows, length].

        Returns the log-softmax of the logits as the filter left them when it computed one (the
        search needs the same one: ``WindowDecode`` passes it on instead of computing it twice)."""
        raise NotImplementedError

    def suppress(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        """The part of ``apply`` that depends on the tokens only (here: all of it): which ids are -inf.

        A screened greedy step (``decoding/screened.py``) builds the mask from this without logits."""
        self.apply(logits, tokens)


class SuppressBlank(LogitFilter):
    def __init__(self, blank_ids: Sequence[int], sample_begin: int) -> None:
        self.blank_ids = torch.tensor(list(blank_ids), dtype=torch.long)
        self.sample_begin = sample_begin

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        if tokens.shape[1] == self.sample_begin:
            logits.index_fill_(1, self.blank_ids.to(logits.device), NEG_INF)


class SuppressTokens(LogitFilter):
    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = torch.tensor(list(ids), dtype=torch.long)  # built once, not per token

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        logits.index_fill_(1, self.ids.to(logits.device), NEG_INF)


class TimestampRules(LogitFilter):
    def __init__(
        self,
        timestamp_begin: int,
        eot: int,
        no_timestamps: int,
        sample_begin: int,
        max_initial_timestamp_index: int | None,
    ) -> None:
        self.ts = timestamp_begin
        self.eot = eot
        self.no_timestamps = no_timestamps
        self.sample_begin = sample_begin
        self.max_initial_index = max_initial_timestamp_index

    def apply(self, logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.suppress(logits, tokens)
        force, logprobs = self._forced(logits)
        if force.any():
            rows = force.nonzero().flatten()
            # by row index, not the boolean mask: the mask's fill ran over every row (1.1 against 0.06 ms
            # for 40 rows, scratch), the same values set
            logits[rows, : self.ts] = NEG_INF
            # only the forced rows changed: their log-softmax again (a row's does not depend on the
            # others in the call: tested), not every row's as the search would
            logprobs[rows] = torch.log_softmax(logits[rows].float(), dim=-1)
        return logprobs

    def forced(self, logits: torch.Tensor) -> torch.Tensor:
        """Rows [rows] (bool) whose timestamps' total probability beats every text token's."""
        return self._forced(logits)[0]

    def _forced(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        timestamp_mass = logprobs[:, self.ts :].logsumexp(dim=-1)
        best_text = logprobs[:, : self.ts].amax(dim=-1)  # amax: same values, ~5x faster than max(dim)
        return timestamp_mass > best_text, logprobs

    def suppress(self, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        """The rules that follow from the tokens alone (``apply`` adds the forced timestamp)."""
        n = logits.shape[1]
        for row, sampled in enumerate(tokens[:, self.sample_begin :].tolist()):  # one copy, not one a row
            for lo, hi in self.row_ranges(sampled, n):
                logits[row, lo:hi] = NEG_INF
        for lo, hi in self.common_ranges(tokens.shape[1] == self.sample_begin, n):
            logits[:, lo:hi] = NEG_INF

    def row_ranges(self, sampled: list[int], n: int) -> list[tuple[int, int]]:
        """The id ranges [lo, hi) a row's own sampled tokens rule out (of ``n`` ids). The one statement of
        these rules: ``suppress`` and the fused greedy step (``decoding/greedy_choice.py``) both read it."""
        ts = self.ts
        ranges = []
        last_is_ts = len(sampled) >= 1 and sampled[-1] >= ts
        penultimate_is_ts = len(sampled) < 2 or sampled[-2] >= ts
        if last_is_ts:
            if penultimate_is_ts:  # a pair just closed (or it opened the text): text must follow
                ranges.append((ts, n))
            else:  # a single timestamp after text: close it with a timestamp or end of text
                ranges.append((0, self.eot))
        last_stamp = next((t for t in reversed(sampled) if t >= ts), None)
        if last_stamp is not None:
            # never go back in time; after a closing stamp, the next one must be strictly later
            floor = last_stamp if (last_is_ts and not penultimate_is_ts) else last_stamp + 1
            ranges.append((ts, min(floor, n)))
        return ranges

    def common_ranges(self, at_start: bool, n: int) -> list[tuple[int, int]]:
        """The id ranges every row rules out: <|notimestamps|>; at the first sampled token, all text (it is
        a timestamp) and timestamps after ``max_initial_timestamp``."""
        ranges = [(self.no_timestamps, self.no_timestamps + 1)]
        if at_start:
            ranges.append((0, self.ts))  # the first token is a timestamp
            if self.max_initial_index is not None:
                ranges.append((min(self.ts + self.max_initial_index + 1, n), n))
        return ranges


def hold_end_of_text(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    bounds: torch.Tensor,
    timestamp_begin: int,
    eot: int,
    sure: float = 0.9,
) -> None:
    """No end of text for rows whose decoded text ends before their floor, unless the decoder gives end
    of text a probability over ``sure``; while held, no timestamp past their ceiling. ``bounds``
    [rows, 2]: (floor, ceiling) in timestamp indices; ``tokens`` the sampled tokens only [rows, n].

    Where the text ends is the last timestamp that closed text: the last token, or the one before an
    opening timestamp. A row whose last token is text is not held (its window counts as decoded to its
    end, as the seek rule reads it). Why a ceiling: held after text that ends early, the decoder can
    open a segment past the audio (29.88 s in a 27 s window) and so give no end of text anywhere useful.
    The floor is at most the ceiling, so a held row always has an allowed token. Why ``sure``: what the
    detector calls speech is sometimes breath or noise; held there, the decoder wrote "You" in the last
    0.3 s of a chunk, where it gave end of text 0.91-0.97 (tiny.en, beam 5). Where it had stopped a
    sentence early it gave 0.33-0.63.
    """
    n = tokens.shape[1]
    if n < 2:  # nothing but the opening timestamp yet: the rules force text next
        return
    last, before = tokens[:, -1], tokens[:, -2]
    end = torch.where(before >= timestamp_begin, before, last) - timestamp_begin
    held = (last >= timestamp_begin) & (end < bounds[:, 0])
    if not bool(held.any()):
        return
    rows = held.nonzero().flatten()
    p_end = logits[rows].float().log_softmax(dim=-1)[:, eot].exp()
    held[rows[p_end > sure]] = False
    logits[held, eot] = NEG_INF
    stamps = torch.arange(logits.shape[1] - timestamp_begin)
    past = held[:, None] & (stamps[None, :] > bounds[:, 1:2])
    logits[:, timestamp_begin:].masked_fill_(past, NEG_INF)
