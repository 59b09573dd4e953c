"""One streaming update in this process: the audio buffer → a hypothesis, carrying forward only what is valid.

Each update builds the buffer's log-Mel window (normalised by the buffer's own maximum, as Whisper's
front end does) and asks, through the reuse ledger, whether the previous update's encoder output,
Cross-KV and prompt Self-KV have exactly this update's provenance. They do when the buffer and prompt
are unchanged (the flush at the end of an utterance re-decodes the buffer the last update saw); a grown
buffer is refused (``mel_digest``) and re-encoded. Temperature-fallback retries reuse the update's own
window and prompt state, also by provenance.

``warm`` runs the whole path once before audio arrives (a second of silence, and the word aligner on a
made-up segment), then forgets it: a stream's first update would otherwise pay for the tokenizer's
suppression lists, the first encoder and decoder calls and the aligner, and start the stream behind.

``naive_reuse`` is the benchmark's deliberately invalid path: when the buffer only grew since an update
that encoded it, the stale encoder output and Cross-KV are reused without a check
(``decode_window(..., force_reuse=True)``), as a skip-encode optimisation would, every other update.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from whisperkv.audio import HOP_LENGTH, SAMPLE_RATE
from whisperkv.cache.store import CacheStore, EncodedWindow
from whisperkv.decoding.decode import decode_window
from whisperkv.decoding.options import DecodingResult
from whisperkv.stream.hypothesis import Hypothesis
from whisperkv.stream.prompt_decode import PromptState, decode_greedy
from whisperkv.stream.update_state import StreamState, UpdateWindow
from whisperkv.timing import add_word_timestamps
from whisperkv.transcribe import DEFAULT_TEMPERATURES

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer


class LocalDecoder:
    def __init__(
        self,
        model: Whisper,
        language: str | None = "en",
        *,
        temperatures: Sequence[float] = DEFAULT_TEMPERATURES,
        naive_reuse: bool = False,
        request_id: str | None = None,
    ) -> None:
        self.model = model
        self.state = StreamState(model, language, temperatures, request_id)
        self.naive_reuse = naive_reuse
        self.previous_was_fresh = False
        self.stale_updates = 0
        self.record: list[dict] | None = None  # the benchmark sets a list to keep each update's inputs

    # the stream's state, read by tests and the benchmark
    @property
    def tokenizer(self) -> Tokenizer:
        return self.state.tokenizer

    @property
    def store(self) -> CacheStore:
        return self.state.store

    @property
    def previous(self) -> EncodedWindow | None:
        return self.state.previous

    @property
    def prompt_state(self) -> PromptState | None:
        return self.state.prompt_state

    @property
    def updates(self) -> int:
        return self.state.updates

    @property
    def encodes(self) -> int:
        return self.state.encodes

    def warm(self) -> None:
        """Decode once what no stream will hear, and forget it (counts, ledger and cached windows)."""
        record, self.record = self.record, None
        self.decode(np.zeros(SAMPLE_RATE, dtype=np.float32), 0, "Warm up.")
        tokens = self.state.tokenizer.encode(" And so, my fellow Americans.")
        segment = {"seek": 0, "start": 0.0, "end": 1.0, "text": "", "tokens": tokens}
        add_word_timestamps(
            segments=[segment],
            model=self.model,
            tokenizer=self.state.tokenizer,
            num_frames=SAMPLE_RATE // HOP_LENGTH,
            last_speech_timestamp=0.0,
            window=self.state.previous,
            store=self.state.store,
        )
        self.state.reset()
        self.previous_was_fresh, self.stale_updates = False, 0
        self.record = record

    def release(self) -> None:
        """The session's buffer moved past everything held (an utterance closed): free it."""
        self.state.release()
        self.previous_was_fresh = False

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str) -> Hypothesis:
        """The hypothesis for ``audio`` (the buffer, starting at ``start_sample`` of the stream)."""
        state = self.state
        state.updates += 1
        update = UpdateWindow(state, audio, start_sample)
        window, stale = self._window(update)
        state.settle_language(window)
        result = self._decode_with_fallback(window, state.prompt_tokens(prompt), stale, update)
        hypothesis = state.hypothesis(result, window, update)
        if self.record is not None:
            self.record.append(
                {
                    "audio": audio.copy(),
                    "start": start_sample,
                    "prompt": prompt,
                    "stale": stale,
                    "text": hypothesis.text,
                }
            )
        return hypothesis

    def _window(self, update: UpdateWindow) -> tuple[EncodedWindow, bool]:
        """This update's encoder output and Cross-KV: the previous ones if exactly valid, else fresh."""
        previous = self.state.previous
        if (
            previous is not None
            and self.naive_reuse
            and self.previous_was_fresh
            and previous.provenance.window_start == update.start
            and previous.provenance.window_end < update.end
        ):
            self.state.ledger.force("encoder_output")
            self.state.ledger.force("cross_kv")
            self.previous_was_fresh = False
            self.stale_updates += 1
            return previous, True
        encodes = self.state.encodes
        window = self.state.encode(update)
        if self.state.encodes > encodes:
            self.previous_was_fresh = True
        return window, False

    def _decode_with_fallback(
        self, window: EncodedWindow, prompt_tokens: list[int], stale: bool, update: UpdateWindow
    ) -> DecodingResult:
        state = self.state
        attempt = 0
        while True:
            options = state.options(prompt_tokens, attempt)
            if stale:  # the invalid path, exactly as a skip-encode optimisation would take it
                result = decode_window(
                    self.model,
                    state.tokenizer,
                    window.audio_features,
                    options,
                    cross_kv=window.cross_kv,
                    encoder_provenance=update.requested,
                    force_reuse=True,
                )
            else:
                result, state.prompt_state = decode_greedy(
                    self.model,
                    state.tokenizer,
                    window,
                    options,
                    state.reusable_prompt(window, options),
                    state.generator,
                )
            if not state.retry(result, attempt):
                return result
            attempt += 1

    def reuse_summary(self) -> dict:
        return self.state.summary()
