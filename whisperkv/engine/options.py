"""The options of one transcription job: ``transcribe()``'s keywords, checked once when the job is made.

A server passes whatever a client sent, so every name and value is checked here, before the job
reaches the scheduler: an unknown option or an impossible combination is a ``ValueError`` naming it,
raised to the caller, never an error inside the loop that owns the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from whisperkv.decoding.decode import check_options
from whisperkv.decoding.options import DecodingOptions

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
DECODING_NAMES = frozenset(f.name for f in fields(DecodingOptions))


@dataclass
class TranscribeOptions:
    """``transcribe()``'s keyword options (openai-whisper's names and defaults) plus the decoding ones."""

    verbose: bool | None = None
    temperature: float | Sequence[float] = DEFAULT_TEMPERATURES
    compression_ratio_threshold: float | None = 2.4
    logprob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6
    condition_on_previous_text: bool = True
    initial_prompt: str | None = None
    carry_initial_prompt: bool = False
    word_timestamps: bool = False
    prepend_punctuations: str = "\"'“¿([{-"
    append_punctuations: str = "\"'.。,，!！?？:：”)]}、"
    clip_timestamps: str | list[float] = "0"
    hallucination_silence_threshold: float | None = None
    #: every other keyword: DecodingOptions fields (language, task, beam_size, best_of, hotwords, ...)
    decode_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, options: dict[str, Any] | None) -> TranscribeOptions:
        """Split keywords into the loop's own and the decoder's; refuse any name neither knows."""
        own = {f.name for f in fields(cls)} - {"decode_options"}
        loop: dict[str, Any] = {}
        decode: dict[str, Any] = {}
        for name, value in (options or {}).items():
            if name in own:
                loop[name] = value
            elif name == "fp16":
                continue  # precision is the model's dtype
            elif name in DECODING_NAMES:
                decode[name] = value
            else:
                raise ValueError(f"unknown transcribe option {name!r}")
        result = cls(**loop, decode_options=decode)
        result.check()
        return result

    @property
    def temperatures(self) -> list[float]:
        t = self.temperature
        return [float(t)] if isinstance(t, (int, float)) else [float(x) for x in t]

    def check(self) -> None:
        """Every decode the fallback schedule can run must be a valid one (checked now, not mid-job)."""
        if not self.temperatures:
            raise ValueError("temperature: at least one temperature is needed")
        if any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperature must not be negative, got {self.temperature!r}")
        base = DecodingOptions(**self.decode_options)
        for t in self.temperatures:
            check_options(fallback_options(base, t))
        if self.hallucination_silence_threshold is not None and self.hallucination_silence_threshold < 0:
            raise ValueError("hallucination_silence_threshold must not be negative")


def fallback_options(base: DecodingOptions, temperature: float) -> DecodingOptions:
    """The options of one attempt: sampling drops beams, greedy drops best-of (as the reference does)."""
    if temperature > 0:
        return replace(base, temperature=temperature, beam_size=None, patience=None)
    return replace(base, temperature=temperature, best_of=None)
