"""What a stream carries from one update to the next, whoever runs the model: its own cache store and
reuse ledger, the last update's window and prompt state, and the rules that turn a decode into a
hypothesis.

Both decoders of a stream use it: ``LocalDecoder`` (this process, one update at a time) and the server's
``UpdateJob`` (one update as a job of the scheduler, batched with other requests). So the same update
takes the same reuse on either path, by the same provenance checks, and gives the same hypothesis.

Provenance names the stream (``request_id``): a store made for one stream never serves another, even
for identical audio — a window handed to another stream's ledger is refused on ``request_id``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from whisperkv.audio import HOP_LENGTH, N_FRAMES, SAMPLE_RATE, pad_or_trim
from whisperkv.audio_source import InMemorySource
from whisperkv.cache.provenance import CrossKVProvenance
from whisperkv.cache.store import CacheStore, EncodedWindow
from whisperkv.decoding.decode import initial_tokens
from whisperkv.decoding.language import detect_language_from_features
from whisperkv.decoding.options import DecodingOptions, DecodingResult
from whisperkv.local_encoder import LocalEncoder
from whisperkv.stream.hypothesis import Hypothesis, hypothesis_from_segments, split_segments
from whisperkv.stream.prompt_decode import PromptState, prompt_provenance
from whisperkv.stream.reuse import ReuseLedger
from whisperkv.timing import add_word_timestamps

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper

#: the seed of a stream's own sampling generator (the fallback temperatures): the same draws whichever
#: path decodes the stream and whatever else runs beside it
SAMPLING_SEED = 0


class UpdateWindow:
    """One update's input: the buffer's log-Mel window, where it lies in the stream, its provenance."""

    def __init__(self, state: StreamState, audio: np.ndarray, start_sample: int) -> None:
        model = state.model
        source = InMemorySource(audio, model.dims.n_mels, name="<stream buffer>")
        self.frames = min(N_FRAMES, source.content_frames)
        self.mel = pad_or_trim(source.mel(0, self.frames), N_FRAMES)[None].to(model.device, model.dtype)
        self.start = start_sample
        self.end = start_sample + self.frames * HOP_LENGTH
        self.requested = replace(
            model.encoder_provenance(self.mel, self.start, self.end), request_id=state.store.request_id
        )

    @property
    def duration(self) -> float:
        return self.frames * HOP_LENGTH / SAMPLE_RATE


class StreamState:
    """One stream's store, ledger, last window and prompt state; the counts its ``reuse`` line reports."""

    def __init__(
        self,
        model: Whisper,
        language: str | None,
        temperatures: Sequence[float],
        request_id: str | None = None,
    ) -> None:
        self.model = model
        self.language = language
        self.temperatures = list(temperatures)
        self.request_id = request_id or f"stream-{uuid.uuid4().hex[:12]}"
        self.reset()

    def reset(self) -> None:
        """Forget every window, prompt state, count and detected language (after the warm-up)."""
        self.tokenizer = self.model.tokenizer.with_options(language=self.language or "en", task="transcribe")
        self.detecting = self.model.is_multilingual and self.language is None
        # one stream is one request: its provenance records name it, and nothing it holds serves another
        self.store = CacheStore(LocalEncoder(), max_entries=1, request_id=self.request_id)
        self.ledger = ReuseLedger(self.store)
        self.previous: EncodedWindow | None = None
        self.prompt_state: PromptState | None = None
        self.generator = torch.Generator().manual_seed(SAMPLING_SEED)
        self.updates = self.encodes = 0

    def release(self) -> None:
        """The buffer moved on (an utterance closed): nothing held can serve a later update, free it."""
        self.store.entries.clear()
        self.previous, self.prompt_state = None, None

    # -- reuse, by provenance ----------------------------------------------------------------------

    def reusable_window(self, update: UpdateWindow) -> EncodedWindow | None:
        """The previous update's encoder output and Cross-KV if their provenance is exactly this update's."""
        previous = self.previous
        if previous is None:
            return None
        same_output = self.ledger.ask("encoder_output", previous.provenance, update.requested)
        same_cross = self.ledger.ask(
            "cross_kv", previous.cross_kv[0].provenance, CrossKVProvenance(update.requested, 0)
        )
        return previous if same_output and same_cross else None

    def encoded(self, window: EncodedWindow) -> EncodedWindow:
        """A window encoded for this update (through ``store``): the one a later update may reuse."""
        self.encodes += 1
        self.previous = window
        return window

    def encode(self, update: UpdateWindow) -> EncodedWindow:
        """This update's window: the previous one where provenance allows, else encoded now."""
        reused = self.reusable_window(update)
        if reused is not None:
            return reused
        window = self.store.encode(self.model, update.mel, update.start, update.end, "stream update")
        return self.encoded(window)

    def reusable_prompt(self, window: EncodedWindow, options: DecodingOptions) -> PromptState | None:
        """The previous prompt state when its tokens, positions and Cross-KV are exactly this decode's."""
        if self.prompt_state is None:
            return None
        n_ctx = self.model.dims.n_text_ctx
        requested = prompt_provenance(initial_tokens(self.tokenizer, options, n_ctx, n_ctx // 2), window)
        if self.ledger.ask("prompt_self_kv", self.prompt_state.provenance, requested):
            return self.prompt_state
        return None

    def settle_language(self, window: EncodedWindow) -> bool:
        """A multilingual stream given no language: detected once, on its first window (``transcribe``
        detects on its first 30 s), and kept for the stream. True when it was detected now."""
        if not self.detecting:
            return False
        language, _ = detect_language_from_features(self.model, window.audio_features)
        self.tokenizer = self.model.tokenizer.with_options(language=language, task="transcribe")
        self.detecting = False
        return True

    # -- one update's decode -----------------------------------------------------------------------

    def prompt_tokens(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(" " + prompt.strip()) if prompt.strip() else []

    def options(self, prompt_tokens: list[int], attempt: int) -> DecodingOptions:
        """Greedy (or sampling) at the ``attempt``-th temperature of the fallback schedule."""
        return DecodingOptions(
            language=self.tokenizer.language,
            prompt=prompt_tokens or None,
            temperature=self.temperatures[attempt],
        )

    def retry(self, result: DecodingResult, attempt: int) -> bool:
        """Whether to decode again at the next temperature (``transcribe``'s fallback rule)."""
        too_repetitive = result.compression_ratio > 2.4
        too_improbable = result.avg_logprob < -1.0
        silence = result.no_speech_prob > 0.6 and too_improbable
        return attempt + 1 < len(self.temperatures) and not silence and (too_repetitive or too_improbable)

    def hypothesis(self, result: DecodingResult, window: EncodedWindow, update: UpdateWindow) -> Hypothesis:
        """The buffer's words with times (from the alignment heads), unless ``transcribe`` would call the
        window silence; ``repetitive`` when even the last temperature looped."""
        if result.no_speech_prob > 0.6 and result.avg_logprob < -1.0:  # transcribe's silence rule
            return Hypothesis()
        segments, closed = split_segments(result.tokens, self.tokenizer, update.duration)
        add_word_timestamps(
            segments=segments,
            model=self.model,
            tokenizer=self.tokenizer,
            num_frames=update.frames,
            last_speech_timestamp=0.0,
            window=window,
            store=self.store,
            with_marks=True,  # ``--confident`` weighs a word with its punctuation
        )
        hypothesis = hypothesis_from_segments(segments, closed)
        hypothesis.repetitive = result.compression_ratio > 2.4
        return hypothesis

    def summary(self) -> dict:
        return {**self.ledger.summary(), "updates": self.updates, "encodes": self.encodes}
