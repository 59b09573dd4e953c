"""A greedy step at temperature 0: its logit filters and its token choice in one pass (a C kernel).

Why: after the decoder, a float32 greedy step went over its 51,864 logits five times through PyTorch
(the filters' fills, a log-softmax into a new row, a logsumexp of the timestamps, the amax of the text,
an argmax), plus the filters' Python: 0.52 ms of a 3.6 ms step in a transcription of the long file
(scratch). ``kernels/greedy_choice.c`` fills the filtered ranges with -inf and returns, for the text ids
and for the timestamps, the largest logit, the first id holding it and the sum of exp(logit − largest)
(in double). That is all the choice needs:

* the timestamp rule compares the timestamps' total log-probability with the best text token's; the
  normaliser cancels, so it is ``largest_ts + log(sum_ts) > largest_text``. PyTorch's float32 path
  rounds its log-probabilities first; where the two sides are within a margin far above that rounding
  (1e-3 and more), the row is not decided here: it goes through the filters and ``GreedySearch``
  (the twin), so the decision is always PyTorch's;
* the token is the first largest allowed logit (the argmax's), of the timestamps when one is forced;
* its log-probability is ``−log(sum)`` (the chosen logit is the largest), within 1e-6 of float64's;
  PyTorch's float32 log-softmax of these rows is off by about 1.3e-5 (measured on real steps: RESULTS,
  round 20). Tokens are therefore exactly the twin's; the summed log-probability (``avg_logprob``)
  moves by ~1e-5. Every greedy loop takes its step through ``choose_next`` (``decode_windows``, the
  scheduler's windows, streaming's prompt-state decode, ``explain``'s replay, the screen's deferred
  sums), so they agree with each other bit for bit.

Without the kernel (no compiler), or for other filters, logits or searchers, the twin runs.
"""

from __future__ import annotations

import ctypes
import functools
import math

import numpy as np
import torch

from whisperkv.cpu.attend import kernel_function
from whisperkv.decoding.logit_filters import LogitFilter, SuppressBlank, SuppressTokens, TimestampRules
from whisperkv.decoding.search import BeamSearch, GreedySearch

FUSABLE_FILTERS = (SuppressBlank, SuppressTokens, TimestampRules)
NEG_INF = float("-inf")


@functools.cache
def _kernel_fn() -> ctypes._CFuncPtr | None:
    pointer, long = ctypes.c_void_p, ctypes.c_long
    return kernel_function(
        "wkv_greedy_row", ctypes.c_int, [pointer, long, long, pointer, long] + [pointer] * 3
    )


def _id_ranges(ids: torch.Tensor) -> list[tuple[int, int]]:
    """Sorted ids as ranges [lo, hi) of consecutive ids."""
    ranges: list[tuple[int, int]] = []
    for i in sorted(set(ids.tolist())):
        if ranges and ranges[-1][1] == i:
            ranges[-1] = (ranges[-1][0], i + 1)
        else:
            ranges.append((i, i + 1))
    return ranges


def decide(
    top: tuple[float, float], first: tuple[int, int], sums: tuple[float, float], rules: bool
) -> tuple[int, float, bool] | None:
    """(token, its log-probability, timestamp forced?) from the kernel's numbers for one row (text part,
    timestamp part), or None where the twin must decide (a near tie of the timestamp rule, no allowed id,
    a sum that is not finite)."""
    top_text, top_ts = top
    if top_text == NEG_INF and top_ts == NEG_INF:
        return None
    largest = max(top_text, top_ts)
    total = sums[0] * math.exp(top_text - largest) + sums[1] * math.exp(top_ts - largest)
    if not math.isfinite(total) or total <= 0.0:
        return None
    force = False
    if rules and top_ts != NEG_INF:
        if top_text == NEG_INF:
            force = True
        else:
            normaliser = largest + math.log(total)
            mass = top_ts + math.log(sums[1]) - normaliser  # logsumexp of the timestamps' log-probabilities
            best = top_text - normaliser  # the best text token's
            margin = 1e-3 + 1e-5 * (abs(mass) + abs(best) + abs(normaliser) + 11.0)
            if abs(mass - best) <= margin:
                return None
            force = mass > best
    if force:  # the text is -inf now: the timestamps alone are normalised
        return first[1], float(np.float32(-math.log(sums[1]))), True
    token = first[0] if top_text >= top_ts else first[1]
    return token, float(np.float32(-math.log(total))), False


def choose_next(
    choice: GreedyChoice | None,
    filters: list[LogitFilter],
    searcher: GreedySearch | BeamSearch,
    tokens: torch.Tensor,
    logits: torch.Tensor,
    sum_logprobs: torch.Tensor,
) -> tuple[torch.Tensor, bool, torch.Tensor | None]:
    """One step's filters and token choice, as every decoding loop takes it: the fused greedy step where
    ``choice`` is given (``GreedyChoice.for_window``), otherwise the filters then the searcher. Returns
    the searcher's (tokens, completed, beam sources)."""
    if choice is not None:
        return choice.update(tokens, logits, sum_logprobs)
    logprobs = None
    for f in filters:  # the last filter's log-softmax, if it made one, is the search's too
        logprobs = f.apply(logits, tokens)
    return searcher.update(tokens, logits, sum_logprobs, logprobs)


class GreedyChoice:
    """The filters and ``GreedySearch.update`` of a temperature-0 greedy window, fused (see above)."""

    def __init__(self, filters: list[LogitFilter], searcher: GreedySearch) -> None:
        self.filters = filters
        self.searcher = searcher
        self.fixed: list[tuple[int, int]] = []
        self.blank: SuppressBlank | None = None
        self.rules: TimestampRules | None = None
        for f in filters:
            if isinstance(f, SuppressTokens):
                self.fixed += _id_ranges(f.ids)
            elif isinstance(f, SuppressBlank):
                self.blank = f
            elif isinstance(f, TimestampRules):
                self.rules = f
        self.blank_ranges = _id_ranges(self.blank.blank_ids) if self.blank is not None else []
        # the kernel's arguments, allocated once (``ndarray.ctypes`` costs ~10 µs a call): the ranges to
        # fill (the suppressed tokens' first, the same every step), the two parts' largest logits, first
        # ids and sums
        most = len(self.fixed) + len(self.blank_ranges) + 8  # the timestamp rules add at most 5
        self._ranges = np.zeros((most, 2), dtype=np.int64)
        self._ranges[: len(self.fixed)] = np.asarray(self.fixed, dtype=np.int64).reshape(-1, 2)
        self._top = np.empty(2, dtype=np.float32)
        self._first = np.empty(2, dtype=np.int64)
        self._sums = np.empty(2, dtype=np.float64)
        self._pointers = tuple(a.ctypes.data for a in (self._ranges, self._top, self._first, self._sums))
        self.twin_rows = 0  # rows the kernel left to the twin (near ties)

    @classmethod
    def for_window(cls, searcher: GreedySearch | object, filters: list[LogitFilter]) -> GreedyChoice | None:
        """The fused step for these filters and searcher, or None where it does not apply."""
        if not isinstance(searcher, GreedySearch) or searcher.temperature != 0 or _kernel_fn() is None:
            return None
        if not all(type(f) in FUSABLE_FILTERS for f in filters):
            return None
        return cls(filters, searcher)

    def update(
        self, tokens: torch.Tensor, logits: torch.Tensor, sum_logprobs: torch.Tensor
    ) -> tuple[torch.Tensor, bool, None]:
        """What the filters then ``GreedySearch.update`` return, for ``logits`` [rows, vocab] (edited in
        place), ``tokens`` [rows, length]; adds the chosen log-probabilities into ``sum_logprobs``."""
        fn = _kernel_fn()
        if (
            fn is None
            or logits.dtype != torch.float32
            or not logits.is_cpu
            or logits.stride(-1) != 1
            or logits.requires_grad
            or sum_logprobs.dtype != torch.float32
            or not sum_logprobs.is_contiguous()
            or not tokens.is_cpu
        ):
            return self._twin(tokens, logits, sum_logprobs)
        rows, n = logits.shape
        rules = self.rules
        split = rules.ts if rules is not None else n
        begin = rules.sample_begin if rules is not None else None
        sampled = tokens.numpy()[:, begin:].tolist() if rules is not None else None
        common: list[tuple[int, int]] = []  # after the fixed ranges, already in the buffer
        if self.blank is not None and tokens.shape[1] == self.blank.sample_begin:
            common += self.blank_ranges
        if rules is not None:
            common += rules.common_ranges(tokens.shape[1] == rules.sample_begin, n)
        chosen = np.zeros(rows, dtype=np.float32)
        next_tokens = np.zeros(rows, dtype=np.int64)
        ranges_at, top_at, first_at, sums_at = self._pointers
        row_bytes, start = logits.stride(0) * 4, logits.data_ptr()  # float32 rows (checked above)
        for r in range(rows):
            more = common + rules.row_ranges(sampled[r], n) if rules is not None else common
            at = len(self.fixed)
            for lo, hi in more:
                self._ranges[at] = lo, hi
                at += 1
            status = fn(start + r * row_bytes, n, split, ranges_at, at, top_at, first_at, sums_at)
            decided = None
            if status == 0:
                decided = decide(
                    (float(self._top[0]), float(self._top[1])),
                    (int(self._first[0]), int(self._first[1])),
                    (float(self._sums[0]), float(self._sums[1])),
                    rules is not None,
                )
            if decided is None:
                self.twin_rows += 1
                next_tokens[r], chosen[r] = self._twin_row(tokens[r : r + 1], logits[r : r + 1])
            else:
                next_tokens[r], chosen[r] = decided[0], decided[1]
        return self.searcher.take(tokens, next_tokens, chosen, sum_logprobs)

    def _twin(
        self, tokens: torch.Tensor, logits: torch.Tensor, sum_logprobs: torch.Tensor
    ) -> tuple[torch.Tensor, bool, None]:
        tokens, completed, _ = choose_next(None, self.filters, self.searcher, tokens, logits, sum_logprobs)
        return tokens, completed, None

    def _twin_row(self, tokens: torch.Tensor, logits: torch.Tensor) -> tuple[int, np.float32]:
        """One row's (token, log-probability) as the twin chooses them (the kernel's fills are the
        filters' own, so applying the filters again changes nothing they did not)."""
        sums = torch.zeros(1)
        grown, _, _ = self._twin(tokens, logits, sums)
        return int(grown[0, -1]), np.float32(sums[0])
