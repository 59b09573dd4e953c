"""One streaming update as a job of the server's scheduler, with the stream's state carried between jobs.

A Realtime session's updates used to be plain transcription jobs: each re-encoded its buffer, since a
job keeps nothing. An ``UpdateJob`` is the same update ``LocalDecoder`` makes, cut where the scheduler
drives it, so its decoder steps are batched with every other request's while its reuse is the stream's:

    UpdateJob(state, audio, start, prompt)   the buffer's log-Mel and provenance (the caller's thread)
    next_window()      the previous update's window if the stream's ledger accepts its provenance; else
                       none, and the scheduler encodes through the stream's store (named for the stream)
    window_rows(task)  greedy rows whose prefill takes the previous prompt state where the ledger
                       accepts it (a temperature retry, the same buffer decoded again), else runs it
    window_done(...)   the next temperature if ``transcribe``'s fallback rule asks, else the hypothesis
                       (words from the alignment heads, on the scheduler's thread)
    result()           {"hypothesis": ..., "reuse": the stream's counts so far}

The jobs of one stream run one at a time (the session waits for each), so the state has one writer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from whisperkv.cache.store import CacheStore, EncodedWindow
from whisperkv.decoding.options import DecodingResult
from whisperkv.decoding.window import WindowDecode
from whisperkv.engine.job import WindowTask
from whisperkv.stream.hypothesis import Hypothesis
from whisperkv.stream.prompt_decode import PromptState, prompt_provenance
from whisperkv.stream.update_state import StreamState, UpdateWindow


@dataclass
class UpdateTask(WindowTask):
    """A window of a stream: where it lies is counted in the stream's samples, not in Mel frames."""

    start_sample: int = 0
    end_sample: int = 0

    @property
    def window_start(self) -> int:
        return self.start_sample

    @property
    def window_end(self) -> int:
        return self.end_sample


class PromptRows(WindowDecode):
    """One greedy (or sampling) row whose prompt Self-KV may come from the stream's last decode."""

    def __init__(self, state: StreamState, task: UpdateTask, reused: PromptState | None) -> None:
        super().__init__(
            state.model, state.tokenizer, task.options, task.window, state.request_id, state.generator
        )
        self.window = task.window
        self.stream_state = state
        self.reused = reused

    @torch.no_grad()
    def prefill(self) -> None:
        """The prompt's Self-KV and logits: the reused state's (checked by the ledger) or computed and
        kept for the next decode of this window, as ``prompt_decode.decode_greedy`` does."""
        reused = self.reused
        if reused is not None:
            for kv, key, value in zip(self.cache.self_kv, reused.keys, reused.values):
                kv.append(key, value)
            self.cache.record_tokens(self.tokens[:1])
            logits = reused.logits
        else:
            logits = self.model.decoder(
                self.tokens[:1], self.cache, positions=[self.sot_index, self.sample_begin - 1]
            )
            self.stream_state.prompt_state = PromptState(
                prompt_provenance(self.tokens[0].tolist(), self.window),
                [kv.key.clone() for kv in self.cache.self_kv],
                [kv.value.clone() for kv in self.cache.self_kv],
                logits.clone(),
            )
        self.no_speech_prob = float(logits[0, 0].softmax(dim=-1)[self.tokenizer.no_speech])
        self.advance(logits[:, -1].clone())


class UpdateJob:
    """What the scheduler drives for one update of one stream (the duck type of ``engine.job.Job``)."""

    expected_rows = 1
    all_segments: list[dict] = []  # noqa: RUF012 - never written: an update streams no segments

    def __init__(self, state: StreamState, audio: np.ndarray, start_sample: int, prompt: str) -> None:
        self.state = state
        self.request_id = state.request_id
        self.update = UpdateWindow(state, audio, start_sample)
        self.prompt_tokens = state.prompt_tokens(prompt)
        self.started = False
        self.hypothesis: Hypothesis | None = None

    @property
    def store(self) -> CacheStore:
        return self.state.store

    @property
    def tokenizer(self):  # noqa: ANN201 - Tokenizer
        return self.state.tokenizer

    @property
    def generator(self) -> torch.Generator:
        return self.state.generator

    def start(self) -> None:
        self.state.updates += 1
        self.started = True

    def next_window(self) -> UpdateTask | None:
        """The update's one window, once; None when its hypothesis is made."""
        if self.hypothesis is not None:
            return None
        update = self.update
        return UpdateTask(
            seek=0,
            segment_size=update.frames,
            mel=update.mel[0],
            options=self.state.options(self.prompt_tokens, 0),
            attempt=0,
            window=self.state.reusable_window(update),
            start_sample=update.start,
            end_sample=update.end,
        )

    def window_rows(self, task: UpdateTask) -> PromptRows:
        """The rows that decode ``task`` (the scheduler prefills and steps them)."""
        assert task.window is not None
        if task.window is not self.state.previous:  # the scheduler just encoded it through our store
            self.state.encoded(task.window)
        if self.state.settle_language(task.window):  # the stream's first window: options in its language
            task.options = self.state.options(self.prompt_tokens, task.attempt)
        return PromptRows(self.state, task, self.state.reusable_prompt(task.window, task.options))

    def window_done(self, task: UpdateTask, result: DecodingResult) -> UpdateTask | None:
        """The next temperature's attempt (same window), or None with the hypothesis made."""
        if self.state.retry(result, task.attempt):
            attempt = task.attempt + 1
            options = self.state.options(self.prompt_tokens, attempt)
            return replace(task, options=options, attempt=attempt)
        window: EncodedWindow = task.window  # type: ignore[assignment]
        self.hypothesis = self.state.hypothesis(result, window, self.update)
        return None

    def result(self) -> dict:
        return {"hypothesis": self.hypothesis, "reuse": self.state.summary()}

    def close(self) -> None:
        """Done, failed or cancelled: the stream's store stays the stream's (a later update may reuse it)."""
