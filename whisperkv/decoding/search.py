"""Choosing the next token: greedy/sampling and beam search, plus ranking of finished candidates.

A searcher's ``update`` returns the extended token rows and, for beam search, which old row each
new row continues — the decoding loop uses that to reorder every layer's Self-KV.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from whisperkv.decoding.top_k import top_k


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """Index of each row's largest logit (the first one on ties), like ``logits.argmax(-1)``.

    On the CPU numpy's argmax is ~15x faster than torch's over a 51,865-entry row (5 vs 95 µs
    here), and greedy decoding takes one per token.
    """
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(np.argmax(logits.numpy(), axis=-1))
    return logits.argmax(dim=-1)


def _numpy_views(
    tokens: torch.Tensor, logits: torch.Tensor, sum_logprobs: torch.Tensor, logprobs: torch.Tensor | None
) -> bool:
    """Whether a greedy update can read and write these tensors as NumPy arrays: CPU, float32 logits and
    log-probabilities, a contiguous float32 sum it adds into, int64 tokens."""
    return (
        logprobs is not None
        and all(t.device.type == "cpu" for t in (tokens, logits, sum_logprobs, logprobs))
        and logits.dtype == logprobs.dtype == sum_logprobs.dtype == torch.float32
        and tokens.dtype == torch.int64
        and sum_logprobs.is_contiguous()
        and not any(t.requires_grad for t in (logits, sum_logprobs, logprobs))
    )


class GreedySearch:
    """Argmax at temperature 0, otherwise sampling from softmax(logits / T). Rows are independent."""

    def __init__(self, temperature: float, eot: int, generator: torch.Generator | None = None) -> None:
        self.temperature = temperature
        self.eot = eot
        self.generator = generator

    def update(
        self,
        tokens: torch.Tensor,
        logits: torch.Tensor,
        sum_logprobs: torch.Tensor,
        logprobs: torch.Tensor | None = None,
        through_numpy: bool = True,
    ) -> tuple[torch.Tensor, bool, torch.Tensor | None]:
        """``logprobs``: the log-softmax of ``logits`` when the caller has it already (the same bits).
        ``through_numpy=False``: PyTorch's operations only (the twin of ``_greedy_numpy``, in the tests)."""
        if self.temperature == 0 and through_numpy and _numpy_views(tokens, logits, sum_logprobs, logprobs):
            return self._greedy_numpy(tokens, logits, sum_logprobs, logprobs)  # type: ignore[arg-type]
        if self.temperature == 0:
            next_tokens = argmax_rows(logits)
        else:
            # softmax of the normalised scaled logits, one multinomial draw per row: the same arithmetic
            # and random-number use as the reference, so a seeded run reproduces its samples
            scaled = logits / self.temperature
            probs = torch.softmax(scaled - scaled.logsumexp(dim=-1, keepdim=True), dim=-1)
            next_tokens = torch.multinomial(probs, 1, True, generator=self.generator).squeeze(-1)
        if logprobs is None:
            logprobs = F.log_softmax(logits.float(), dim=-1)
        chosen = logprobs[torch.arange(logprobs.shape[0]), next_tokens]
        finished = tokens[:, -1] == self.eot
        sum_logprobs += chosen * ~finished
        next_tokens[finished] = self.eot  # a finished row keeps emitting end of text
        tokens = torch.cat([tokens, next_tokens[:, None]], dim=-1)
        return tokens, bool((tokens[:, -1] == self.eot).all()), None

    def _greedy_numpy(
        self, tokens: torch.Tensor, logits: torch.Tensor, sum_logprobs: torch.Tensor, logprobs: torch.Tensor
    ) -> tuple[torch.Tensor, bool, None]:
        """``update`` at temperature 0 through NumPy views of the same tensors: the same argmax, the same
        float32 product and sum (one IEEE rounding each, as PyTorch's), written into ``sum_logprobs``.
        Why: the torch path is ten small operations, 100 µs of a 2 ms greedy step in a transcription
        (about 45 here, round 14); ``through_numpy=False`` is its twin in the tests."""
        next_tokens = np.argmax(logits.numpy(), axis=-1)
        chosen = logprobs.numpy()[np.arange(len(next_tokens)), next_tokens]
        return self.take(tokens, next_tokens, chosen, sum_logprobs)

    def take(
        self, tokens: torch.Tensor, next_tokens: np.ndarray, chosen: np.ndarray, sum_logprobs: torch.Tensor
    ) -> tuple[torch.Tensor, bool, None]:
        """The rows' chosen tokens [rows] (int64) and their log-probabilities [rows] (float32) taken: each
        added into ``sum_logprobs`` (contiguous float32, written through NumPy) but a finished row's, which
        keeps emitting end of text. Also the fused greedy step's end (``decoding/greedy_choice.py``)."""
        # NumPy throughout, and plain Python for one row: run between two decoder steps, whose weights
        # have just gone through the CPU's caches, each torch call here cost ~5-10 us (tiny.en)
        held, sums = tokens.numpy(), sum_logprobs.numpy()
        if len(next_tokens) == 1:
            finished = bool(held[0, -1] == self.eot)
            sums[0] += chosen[0] * (not finished)  # as the rows' sum below: NaN stays NaN, one rounding
            if finished:
                next_tokens[0] = self.eot
            ended = bool(next_tokens[0] == self.eot)
        else:
            finished = held[:, -1] == self.eot
            sums += chosen * ~finished
            next_tokens[finished] = self.eot
            ended = bool((next_tokens == self.eot).all())
        grown = np.concatenate([held, next_tokens.astype(held.dtype, copy=False)[:, None]], axis=1)
        return torch.from_numpy(grown), ended, None

    def finalize(self, tokens: torch.Tensor, sum_logprobs: torch.Tensor):
        """tokens [n_audio, n_group, T] → candidates per audio (each ending in eot) and their scores."""
        tokens = F.pad(tokens, (0, 1), value=self.eot)
        return [list(group) for group in tokens], sum_logprobs.tolist()


class BeamSearch:
    """Beam search over ``beam_size`` rows per audio; stops when enough candidates have finished.

    Each step every beam proposes its ``beam_size + 1`` best continuations; the best ``beam_size``
    unfinished ones survive, finished ones (ending in eot) are collected, up to
    ``round(beam_size * patience)`` per audio.
    """

    def __init__(self, beam_size: int, eot: int, patience: float | None = None) -> None:
        self.beam_size = beam_size
        self.eot = eot
        self.max_candidates = round(beam_size * (patience or 1.0))
        if self.max_candidates <= 0:
            raise ValueError(f"invalid beam_size ({beam_size}) or patience ({patience})")
        self.finished: list[dict[tuple[int, ...], float]] | None = None

    def update(
        self,
        tokens: torch.Tensor,
        logits: torch.Tensor,
        sum_logprobs: torch.Tensor,
        logprobs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, bool, torch.Tensor]:
        n_audio = tokens.shape[0] // self.beam_size
        if self.finished is None:
            self.finished = [{} for _ in range(n_audio)]
        if logprobs is None:
            logprobs = F.log_softmax(logits.float(), dim=-1)
        top_logprobs, top_ids = top_k(logprobs, self.beam_size + 1)  # torch.topk's, faster
        # every candidate's score as a float32 sum, rounded exactly as accumulating on the tensor would
        candidate_scores = (sum_logprobs.cpu().float()[:, None] + top_logprobs.cpu()).numpy()
        top_ids = top_ids.tolist()
        # a candidate is (its prefix, its token); identical prefixes (every beam of a window after the
        # prompt) share one id, so keys compare and hash as the reference's whole sequences do, with the
        # same insertion order and overwrites, without building a tuple of every candidate's tokens
        prefixes = tokens.tolist()
        prefix_ids: dict[tuple[int, ...], int] = {}
        prefix_of = [prefix_ids.setdefault(tuple(row), len(prefix_ids)) for row in prefixes]
        sources: list[int] = []
        next_tokens: list[int] = []
        scores_kept: list[float] = []
        for a in range(n_audio):
            scores: dict[tuple[int, int], float] = {}
            parent: dict[tuple[int, int], int] = {}
            for b in range(self.beam_size):
                row = a * self.beam_size + b
                for score, tok in zip(candidate_scores[row].tolist(), top_ids[row]):
                    key = (prefix_of[row], tok)
                    scores[key] = score
                    parent[key] = row
            kept = 0
            newly_finished: dict[tuple[int, int], float] = {}
            for key in sorted(scores, key=scores.get, reverse=True):
                if key[1] == self.eot:
                    newly_finished[key] = scores[key]
                    continue
                scores_kept.append(scores[key])
                sources.append(parent[key])
                next_tokens.append(key[1])
                kept += 1
                if kept == self.beam_size:
                    break
            done = self.finished[a]
            for key in sorted(newly_finished, key=newly_finished.get, reverse=True):
                if len(done) >= self.max_candidates:
                    break
                done[tuple(prefixes[parent[key]]) + (key[1],)] = newly_finished[key]
        sum_logprobs[: len(scores_kept)] = torch.tensor(scores_kept, dtype=sum_logprobs.dtype)
        source_rows = torch.tensor(sources)
        chosen = torch.tensor(next_tokens, dtype=tokens.dtype, device=tokens.device)
        rows = torch.cat([tokens[source_rows.to(tokens.device)], chosen[:, None]], dim=-1)
        completed = all(len(done) >= self.max_candidates for done in self.finished)
        return rows, completed, source_rows

    def full_windows(self) -> list[int]:
        """The windows holding as many finished candidates as they keep: later steps cannot change them."""
        assert self.finished is not None
        return [a for a, done in enumerate(self.finished) if len(done) >= self.max_candidates]

    def keep_windows(self, windows: list[int]) -> list[dict[tuple[int, ...], float]]:
        """Search only ``windows`` (indices among the current ones) from now on, as when the others leave a
        batch; returns the finished candidates of the ones that left, in their order."""
        assert self.finished is not None
        kept = set(windows)
        left = [done for a, done in enumerate(self.finished) if a not in kept]
        self.finished = [self.finished[a] for a in windows]
        return left

    def restore_windows(self, finished: list[dict[tuple[int, ...], float]]) -> None:
        """Every window's finished candidates again, in the batch's order (those that left included)."""
        self.finished = finished

    def finalize(self, tokens: torch.Tensor, sum_logprobs: torch.Tensor):
        """Top up audios with fewer than ``beam_size`` finished candidates from the live beams."""
        assert self.finished is not None
        sum_logprobs = sum_logprobs.cpu()
        for a, done in enumerate(self.finished):
            if len(done) < self.beam_size:
                order = sorted(range(self.beam_size), key=lambda j: float(sum_logprobs[a][j]), reverse=True)
                for j in order:
                    done[tuple(tokens[a, j].tolist() + [self.eot])] = float(sum_logprobs[a][j])
                    if len(done) >= self.beam_size:
                        break
        candidates = [[torch.tensor(seq) for seq in done] for done in self.finished]
        scores = [list(done.values()) for done in self.finished]
        return candidates, scores


def rank(candidates: list[list[int]], scores: list[float], length_penalty: float | None) -> int:
    """Index of the best candidate: log-probability over length (or the Google NMT penalty)."""
    best, best_score = 0, float("-inf")
    for i, (tokens, logprob) in enumerate(zip(candidates, scores)):
        n = len(tokens)
        penalty = n if length_penalty is None else ((5 + n) / 6) ** length_penalty
        score = logprob / penalty
        if score > best_score:
            best, best_score = i, score
    return best
