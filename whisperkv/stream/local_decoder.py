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

import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from whisperkv.audio import HOP_LENGTH, N_FRAMES, pad_or_trim
from whisperkv.audio_source import InMemorySource
from whisperkv.cache.provenance import CrossKVProvenance, EncoderProvenance
from whisperkv.cache.store import CacheStore, EncodedWindow
from whisperkv.decoding.decode import decode_window, initial_tokens
from whisperkv.decoding.options import DecodingOptions, DecodingResult
from whisperkv.local_encoder import LocalEncoder
from whisperkv.stream.hypothesis import Hypothesis, hypothesis_from_segments, split_segments
from whisperkv.stream.prompt_decode import PromptState, decode_greedy, prompt_provenance
from whisperkv.stream.reuse import ReuseLedger
from whisperkv.timing import add_word_timestamps
from whisperkv.transcribe import DEFAULT_TEMPERATURES

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper

SAMPLE_RATE = 16000


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
        if model.is_multilingual and language is None:
            raise ValueError("streaming needs --language with a multilingual model (no detection per update)")
        self.model = model
        self.tokenizer = model.tokenizer.with_options(language=language or "en", task="transcribe")
        self.temperatures = list(temperatures)
        self.naive_reuse = naive_reuse
        # one stream is one request: its provenance records name it, and nothing it holds serves another
        self.store = CacheStore(
            LocalEncoder(), max_entries=2, request_id=request_id or f"stream-{uuid.uuid4().hex[:12]}"
        )
        self.ledger = ReuseLedger(self.store)
        self.previous: EncodedWindow | None = None
        self.previous_was_fresh = False
        self.prompt_state: PromptState | None = None
        self.encodes = 0
        self.updates = 0
        self.stale_updates = 0
        self.record: list[dict] | None = None  # the benchmark sets a list to keep each update's inputs

    def warm(self) -> None:
        """Decode once what no stream will hear, and forget it (counts, ledger and cached windows)."""
        record, self.record = self.record, None
        self.decode(np.zeros(SAMPLE_RATE, dtype=np.float32), 0, "Warm up.")
        tokens = self.tokenizer.encode(" And so, my fellow Americans.")
        segment = {"seek": 0, "start": 0.0, "end": 1.0, "text": "", "tokens": tokens}
        frames = SAMPLE_RATE // HOP_LENGTH
        add_word_timestamps(
            segments=[segment],
            model=self.model,
            tokenizer=self.tokenizer,
            num_frames=frames,
            last_speech_timestamp=0.0,
            window=self.previous,
            store=self.store,
        )
        self.store = CacheStore(LocalEncoder(), max_entries=2, request_id=self.store.request_id)
        self.ledger = ReuseLedger(self.store)
        self.previous, self.previous_was_fresh, self.prompt_state = None, False, None
        self.encodes = self.updates = self.stale_updates = 0
        self.record = record

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str) -> Hypothesis:
        """The hypothesis for ``audio`` (the buffer, starting at ``start_sample`` of the stream)."""
        self.updates += 1
        source = InMemorySource(audio, self.model.dims.n_mels, name="<stream buffer>")
        frames = min(N_FRAMES, source.content_frames)
        mel = pad_or_trim(source.mel(0, frames), N_FRAMES)[None].to(self.model.device, self.model.dtype)
        end_sample = start_sample + frames * HOP_LENGTH
        requested = replace(
            self.model.encoder_provenance(mel, start_sample, end_sample), request_id=self.store.request_id
        )

        window, stale = self._window(mel, requested, start_sample, end_sample)
        prompt_tokens = self.tokenizer.encode(" " + prompt.strip()) if prompt.strip() else []
        result = self._decode_with_fallback(window, prompt_tokens, stale, requested)
        hypothesis = Hypothesis()
        if not (result.no_speech_prob > 0.6 and result.avg_logprob < -1.0):  # transcribe's silence rule
            duration = frames * HOP_LENGTH / SAMPLE_RATE
            segments, closed = split_segments(result.tokens, self.tokenizer, duration)
            add_word_timestamps(
                segments=segments,
                model=self.model,
                tokenizer=self.tokenizer,
                num_frames=frames,
                last_speech_timestamp=0.0,
                window=window,
                store=self.store,
            )
            hypothesis = hypothesis_from_segments(segments, closed)
            hypothesis.repetitive = result.compression_ratio > 2.4
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

    def _window(
        self, mel: torch.Tensor, requested: EncoderProvenance, start_sample: int, end_sample: int
    ) -> tuple[EncodedWindow, bool]:
        """This update's encoder output and Cross-KV: the previous ones if exactly valid, else fresh."""
        previous = self.previous
        if previous is not None:
            if (
                self.naive_reuse
                and self.previous_was_fresh
                and previous.provenance.window_start == start_sample
                and previous.provenance.window_end < end_sample
            ):
                self.ledger.force("encoder_output")
                self.ledger.force("cross_kv")
                self.previous_was_fresh = False
                self.stale_updates += 1
                return previous, True
            same_output = self.ledger.ask("encoder_output", previous.provenance, requested)
            same_cross = self.ledger.ask(
                "cross_kv", previous.cross_kv[0].provenance, CrossKVProvenance(requested, 0)
            )
            if same_output and same_cross:
                return previous, False
        window = self.store.encode(self.model, mel, start_sample, end_sample, "stream update")
        self.encodes += 1
        self.previous, self.previous_was_fresh = window, True
        return window, False

    def _decode_with_fallback(
        self, window: EncodedWindow, prompt_tokens: list[int], stale: bool, requested: EncoderProvenance
    ) -> DecodingResult:
        base = DecodingOptions(language=self.tokenizer.language, prompt=prompt_tokens or None)
        result: DecodingResult | None = None
        for t in self.temperatures:
            options = replace(base, temperature=t)
            if stale:  # the invalid path, exactly as a skip-encode optimisation would take it
                result = decode_window(
                    self.model,
                    self.tokenizer,
                    window.audio_features,
                    options,
                    cross_kv=window.cross_kv,
                    encoder_provenance=requested,
                    force_reuse=True,
                )
            else:
                result, self.prompt_state = decode_greedy(
                    self.model, self.tokenizer, window, options, self._prompt_state(window, options)
                )
            too_repetitive = result.compression_ratio > 2.4
            too_improbable = result.avg_logprob < -1.0
            silence = result.no_speech_prob > 0.6 and too_improbable
            if silence or not (too_repetitive or too_improbable):
                break
        assert result is not None
        return result

    def _prompt_state(self, window: EncodedWindow, options: DecodingOptions) -> PromptState | None:
        """The previous prompt state when its tokens, positions and Cross-KV are exactly this decode's."""
        if self.prompt_state is None:
            return None
        n_ctx = self.model.dims.n_text_ctx
        requested = prompt_provenance(initial_tokens(self.tokenizer, options, n_ctx, n_ctx // 2), window)
        if self.ledger.ask("prompt_self_kv", self.prompt_state.provenance, requested):
            return self.prompt_state
        return None

    def reuse_summary(self) -> dict:
        return {**self.ledger.summary(), "updates": self.updates, "encodes": self.encodes}
