"""The records faster-whisper's API returns, field for field, so code that reads them keeps working."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class Word:
    start: float
    end: float
    word: str
    probability: float


@dataclass
class Segment:
    id: int  # from 1, in order
    seek: int  # first log-Mel frame of the window the segment was decoded in
    start: float
    end: float
    text: str
    tokens: list[int]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[Word] | None  # with ``word_timestamps=True``
    temperature: float | None


@dataclass
class VadOptions:
    """silero-vad's settings with faster-whisper's defaults (2 s of silence ends a speech chunk)."""

    threshold: float = 0.5
    neg_threshold: float | None = None
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400


@dataclass
class TranscriptionOptions:
    beam_size: int
    best_of: int
    patience: float
    length_penalty: float
    repetition_penalty: float
    no_repeat_ngram_size: int
    log_prob_threshold: float | None
    no_speech_threshold: float | None
    compression_ratio_threshold: float | None
    condition_on_previous_text: bool
    prompt_reset_on_temperature: float
    temperatures: list[float]
    initial_prompt: str | Iterable[int] | None
    prefix: str | None
    suppress_blank: bool
    suppress_tokens: list[int] | None
    without_timestamps: bool
    max_initial_timestamp: float
    word_timestamps: bool
    prepend_punctuations: str
    append_punctuations: str
    multilingual: bool
    max_new_tokens: int | None
    clip_timestamps: str | list[float]
    hallucination_silence_threshold: float | None
    hotwords: str | None


@dataclass
class TranscriptionInfo:
    language: str
    language_probability: float
    duration: float  # seconds of audio given
    duration_after_vad: float  # seconds left after the voice-activity filter (= duration without it)
    all_language_probs: list[tuple[str, float]] | None  # most likely first; None for English-only models
    transcription_options: TranscriptionOptions
    vad_options: VadOptions | None
