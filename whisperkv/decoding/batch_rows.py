"""The live rows of a batch of windows, as windows finish: set aside, dropped from the caches, put back.

Batched windows finish at different steps. A finished one is set aside and its rows leave the caches, so
the others' steps stop paying for it (copying the rest's caches costs about two of their steps; measured
3 % faster). At the end every window is put back in place, padded with end of text, so the ranking reads
the batch as if no row had left and the tokens are those of a loop that kept them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from whisperkv.cache.kv import DecoderCache
from whisperkv.decoding.search import BeamSearch


@dataclass
class BatchRows:
    """The rows still decoding, and the windows set aside. ``active`` maps each live window to its
    index in the batch as given; ``bounds`` are the live rows' end-of-text bounds (batched mode)."""

    tokens: torch.Tensor  # [live rows, length]
    sum_logprobs: torch.Tensor  # [live rows]
    active: torch.Tensor  # [live windows]
    bounds: torch.Tensor | None
    set_aside: dict[int, tuple[list[int], float]] = field(default_factory=dict)  # greedy: window → row
    beams_aside: dict[int, dict[tuple[int, ...], float]] = field(default_factory=dict)  # window → candidates

    def _keep(self, keep: torch.Tensor, active: torch.Tensor) -> None:
        self.tokens, self.sum_logprobs, self.active = self.tokens[keep], self.sum_logprobs[keep], active
        self.bounds = self.bounds[keep] if self.bounds is not None else None

    def drop_ended(self, cache: DecoderCache, eot: int, device: torch.device) -> None:
        """Greedy, one row a window: each row at its end of text leaves the batch and its caches."""
        done = self.tokens[:, -1] == eot
        if not int(done.sum()):
            return
        for i in done.nonzero().flatten().tolist():
            self.set_aside[int(self.active[i])] = (self.tokens[i].tolist(), float(self.sum_logprobs[i]))
        keep = (~done).nonzero().flatten()
        self._keep(keep, self.active[keep])
        cache.keep_rows(keep.to(device))

    def drop_full_windows(
        self, searcher: BeamSearch, cache: DecoderCache, n_group: int, device: torch.device
    ) -> None:
        """Beam search: a window holding as many finished candidates as it keeps leaves with them (later
        steps could not change them, nor its result)."""
        full = searcher.full_windows()
        if not full:
            return
        stay = [a for a in range(len(self.active)) if a not in full]
        for a, done in zip(full, searcher.keep_windows(stay), strict=True):
            self.beams_aside[int(self.active[a])] = done
        windows = torch.tensor(stay)
        keep = (windows[:, None] * n_group + torch.arange(n_group)).flatten()
        self._keep(keep, self.active[windows])
        cache.keep_rows(keep.to(device), windows.to(device))

    def restored(
        self, searcher: object, n_audio: int, n_group: int, eot: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every window's rows in place again: (tokens [n_audio * n_group, length], sum_logprobs)."""
        tokens, sum_logprobs = self.tokens, self.sum_logprobs
        if self.set_aside:
            rows = dict(self.set_aside)
            live = enumerate(self.active)
            rows.update((int(a), (tokens[i].tolist(), float(sum_logprobs[i]))) for i, a in live)
            width = max(len(seq) for seq, _ in rows.values())
            tokens = torch.tensor([rows[r][0] + [eot] * (width - len(rows[r][0])) for r in range(n_audio)])
            sum_logprobs = torch.tensor([rows[r][1] for r in range(n_audio)])
        if self.beams_aside:  # a window set aside needs no live rows: its candidates are kept
            assert isinstance(searcher, BeamSearch) and searcher.finished is not None
            live_beams = dict(zip(self.active.tolist(), searcher.finished, strict=True))
            aside = self.beams_aside
            searcher.restore_windows([aside[a] if a in aside else live_beams[a] for a in range(n_audio)])
            rows_t = torch.full((n_audio * n_group, tokens.shape[-1]), eot, dtype=tokens.dtype)
            sums = torch.zeros(n_audio * n_group)
            at = (self.active[:, None] * n_group + torch.arange(n_group)).flatten()
            rows_t[at], sums[at] = tokens, sum_logprobs
            tokens, sum_logprobs = rows_t, sums
        return tokens, sum_logprobs
