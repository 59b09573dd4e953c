"""Options and results of decoding one 30 s window; names and defaults follow openai-whisper."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class DecodingOptions:
    task: str = "transcribe"  # or "translate"
    language: str | None = None  # None: detect (multilingual models)
    temperature: float = 0.0
    sample_len: int | None = None  # max tokens to sample; None = half the text context (224)
    best_of: int | None = None  # independent samples at temperature > 0
    beam_size: int | None = None  # beams at temperature 0
    patience: float | None = None
    length_penalty: float | None = None  # None: divide by length; else Google NMT penalty
    prompt: str | list[int] | None = None  # previous text, placed after <|startofprev|>
    prefix: str | list[int] | None = None  # forced start of this window's text
    #: words to bias towards (faster-whisper's option): without a prefix, they lead every prompt
    hotwords: str | None = None
    suppress_tokens: str | list[int] | None = "-1"  # "-1": the non-speech symbols
    suppress_blank: bool = True
    without_timestamps: bool = False
    max_initial_timestamp: float | None = 1.0
    fp16: bool = True
    #: decode with the reference twin: no cache, the whole prefix recomputed at every step
    use_cache: bool = True
    #: keep every step's raw logits in the result (for ``verify``)
    record_logits: bool = False


@dataclass
class DecodingResult:
    audio_features: torch.Tensor | None
    language: str
    language_probs: dict[str, float] | None = None
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    avg_logprob: float = float("nan")
    no_speech_prob: float = float("nan")
    temperature: float = float("nan")
    compression_ratio: float = float("nan")
    #: per step, the logits of every row before filtering (only with ``record_logits``)
    step_logits: list[torch.Tensor] | None = None
    #: per step, the token ids of every row (only with ``record_logits``)
    step_tokens: list[list[int]] | None = None
    cache: dict[str, Any] | None = None


def compression_ratio(text: str) -> float:
    """Bytes / zlib-compressed bytes: high values flag repetitive (looping) output."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))
