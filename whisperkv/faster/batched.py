"""``BatchedInferencePipeline``: faster-whisper's batched mode, on whisperkv's (``whisperkv.batched``).

Both cut the audio into chunks of at most 30 s at pauses and decode several at once, without the
previous text as a prompt. The chunks are whisperkv's (``vad_filter=True``: silero-vad, else the
energy detector; its own settings, so ``vad_parameters`` is refused), and so are the rules for a chunk
whose decoder stopped early. What whisperkv's batched mode has no counterpart for (word timestamps,
prompts, hotwords, per-window languages, another temperature schedule) is refused by name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np

from whisperkv.audio import SAMPLE_RATE
from whisperkv.chunking import chunks_from_speech, silero_frames, speech_frames
from whisperkv.faster import language as detection
from whisperkv.faster.model import PUNCTUATION_AFTER, PUNCTUATION_BEFORE, WhisperModel, waveform
from whisperkv.faster.options import TEMPERATURES, build_options, check_unsupported, temperatures
from whisperkv.faster.types import Segment, TranscriptionInfo

#: options of faster-whisper's batched ``transcribe`` that whisperkv's batched mode takes only at their
#: default (name → (default, why))
FIXED = {
    "word_timestamps": (False, "no word timestamps in batched mode"),
    "initial_prompt": (None, "batched chunks are decoded without a prompt"),
    "prefix": (None, "batched chunks are decoded without a prefix"),
    "hotwords": (None, "batched chunks are decoded without a prompt"),
    "multilingual": (False, "one language per file in batched mode"),
    "vad_parameters": (None, "whisperkv's batched mode cuts with its own silero settings"),
    "clip_timestamps": (None, "whisperkv's batched mode cuts chunks itself"),
    "task": ("transcribe", "batched mode transcribes"),
    "hallucination_silence_threshold": (None, "needs word timestamps"),
    "log_progress": (False, "no progress bar here"),
}


def check_batched(values: dict[str, Any]) -> None:
    """Refuse by name what whisperkv's batched mode would not do as asked."""
    for name, (default, why) in FIXED.items():
        if values[name] != default:
            raise ValueError(f"{name}={values[name]!r} is not supported by whisperkv's batched mode ({why})")
    check_unsupported(
        values["repetition_penalty"],
        values["no_repeat_ngram_size"],
        values["prompt_reset_on_temperature"],
        values["chunk_length"],
        values["length_penalty"],
    )
    if temperatures(values["temperature"]) != list(TEMPERATURES):
        raise ValueError("temperature: whisperkv's batched mode falls back through 0.0, 0.2, ... 1.0 only")
    suppress = values["suppress_tokens"]
    if suppress is None or [int(t) for t in suppress] != [-1] or not values["suppress_blank"]:
        raise ValueError(
            "suppress_tokens/suppress_blank: whisperkv's batched mode suppresses the default set"
        )
    batch_size = values["batch_size"]
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")


class BatchedInferencePipeline:
    """``BatchedInferencePipeline(model).transcribe(audio, batch_size=8, ...)`` → (segments, info)."""

    def __init__(self, model: WhisperModel) -> None:
        if not isinstance(model, WhisperModel):
            raise TypeError(f"model must be a whisperkv WhisperModel, got {type(model).__name__}")
        self.model = model

    def transcribe(
        self,
        audio: str | os.PathLike | BinaryIO | np.ndarray,
        language: str | None = None,
        task: str = "transcribe",
        log_progress: bool = False,
        beam_size: int = 5,
        best_of: int = 5,
        patience: float = 1,
        length_penalty: float = 1,
        repetition_penalty: float = 1,
        no_repeat_ngram_size: int = 0,
        temperature: float | Sequence[float] = TEMPERATURES,
        compression_ratio_threshold: float | None = 2.4,
        log_prob_threshold: float | None = -1.0,
        no_speech_threshold: float | None = 0.6,
        condition_on_previous_text: bool = True,
        prompt_reset_on_temperature: float = 0.5,
        initial_prompt: str | Iterable[int] | None = None,
        prefix: str | None = None,
        suppress_blank: bool = True,
        suppress_tokens: list[int] | None = (-1,),
        without_timestamps: bool = True,
        max_initial_timestamp: float = 1.0,
        word_timestamps: bool = False,
        prepend_punctuations: str = PUNCTUATION_BEFORE,
        append_punctuations: str = PUNCTUATION_AFTER,
        multilingual: bool = False,
        vad_filter: bool = True,
        vad_parameters: dict | None = None,
        max_new_tokens: int | None = None,
        chunk_length: int | None = None,
        clip_timestamps: list[dict] | None = None,
        hallucination_silence_threshold: float | None = None,
        batch_size: int = 8,
        hotwords: str | None = None,
        language_detection_threshold: float | None = 0.5,
        language_detection_segments: int = 1,
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """(segments, info); the chunks are decoded when the segments are first read."""
        values = dict(locals())
        del values["self"]
        check_batched(values)
        options = build_options({**values, "clip_timestamps": "0", "condition_on_previous_text": False})
        samples = waveform(audio)
        whisper = self.model.model
        speech = silero_frames(samples) if vad_filter else speech_frames(samples)
        chunks = chunks_from_speech(speech, len(samples))
        found = detection.ENGLISH_ONLY if not whisper.is_multilingual else (language, 1.0, None)
        if language is None and whisper.is_multilingual:
            first = samples[chunks[0].start :] if chunks else samples
            found = detection.detect(
                whisper, first, language_detection_segments, language_detection_threshold
            )
        run = {
            "batch_size": batch_size,
            "beam_size": None if beam_size == 1 else beam_size,
            "language": found[0] if whisper.is_multilingual else "en",
            "compression_ratio_threshold": compression_ratio_threshold,
            "logprob_threshold": log_prob_threshold,
            "no_speech_threshold": no_speech_threshold,
            "vad": "silero" if vad_filter else "energy",
            "timestamps": not without_timestamps,
        }
        info = TranscriptionInfo(
            language=run["language"],
            language_probability=found[1],
            duration=len(samples) / SAMPLE_RATE,
            duration_after_vad=sum(c.end - c.start for c in chunks) / SAMPLE_RATE,
            all_language_probs=found[2],
            transcription_options=options,
            vad_options=None,
        )
        return self._segments(samples, run), info

    def _segments(self, samples: np.ndarray, run: dict[str, Any]) -> Iterator[Segment]:
        from whisperkv.batched import transcribe_batched
        from whisperkv.faster.model import segment_record

        result = transcribe_batched(self.model.model, samples, **run)
        index = 0
        for segment in result["segments"]:
            if segment["start"] == segment["end"] or not segment["text"].strip():
                continue
            index += 1
            yield segment_record(index, segment, with_words=False)
