"""faster-whisper's ``transcribe`` keywords → whisperkv's, checked before any audio is decoded.

Most names map one to one. Where the two projects mean different things by one value, the faster-whisper
default is read as what it does there: ``beam_size=1`` is greedy decoding (CTranslate2 decodes one beam
greedily), ``length_penalty=1`` divides a beam's score by its length (openai-whisper's ``None``). What
whisperkv has no counterpart for (a repetition penalty, n-gram blocking, another length-penalty formula)
is refused by name at a non-default value, so a result never silently differs from what was asked.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from whisperkv.faster.types import TranscriptionOptions

#: faster-whisper's temperature schedule (as openai-whisper's)
TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def refuse_unless(name: str, value: Any, supported: Any, why: str) -> None:
    """A ``ValueError`` naming the option when ``value`` is not the one value whisperkv supports."""
    if value != supported:
        raise ValueError(f"{name}={value!r} is not supported by whisperkv ({why}); use {supported!r}")


def check_unsupported(
    repetition_penalty: float,
    no_repeat_ngram_size: int,
    prompt_reset_on_temperature: float,
    chunk_length: int | None,
    length_penalty: float,
) -> None:
    refuse_unless("repetition_penalty", repetition_penalty, 1, "its decoder has no repetition penalty")
    refuse_unless("no_repeat_ngram_size", no_repeat_ngram_size, 0, "its decoder blocks no n-grams")
    refuse_unless(
        "prompt_reset_on_temperature", prompt_reset_on_temperature, 0.5, "the prompt resets above 0.5"
    )
    if chunk_length not in (None, 30):
        raise ValueError(f"chunk_length={chunk_length!r} is not supported by whisperkv: windows are 30 s")
    refuse_unless(
        "length_penalty", length_penalty, 1, "a beam's score is divided by its length, CTranslate2's 1"
    )


def temperatures(temperature: float | Sequence[float]) -> list[float]:
    values = [temperature] if isinstance(temperature, (int, float)) else list(temperature)
    if not values or not all(isinstance(t, (int, float)) and t >= 0 for t in values):
        raise ValueError(f"temperature must be a number >= 0 or a list of them, got {temperature!r}")
    return [float(t) for t in values]


def build_options(values: dict[str, Any]) -> TranscriptionOptions:
    """The ``TranscriptionOptions`` record ``TranscriptionInfo`` carries, from ``transcribe``'s keywords."""
    beam_size, best_of = values["beam_size"], values["best_of"]
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be an integer >= 1, got {beam_size!r}")
    if not isinstance(best_of, int) or best_of < 1:
        raise ValueError(f"best_of must be an integer >= 1, got {best_of!r}")
    if values["patience"] <= 0:
        raise ValueError(f"patience must be above 0, got {values['patience']!r}")
    initial_prompt = values["initial_prompt"]
    if initial_prompt is not None and not isinstance(initial_prompt, str):
        initial_prompt = [int(t) for t in initial_prompt]
    names = set(TranscriptionOptions.__dataclass_fields__) - {"temperatures", "initial_prompt"}
    return TranscriptionOptions(
        temperatures=temperatures(values["temperature"]),
        initial_prompt=initial_prompt,
        **{name: values[name] for name in names},
    )


def suppress_tokens(tokens: Iterable[int] | None) -> str | list[int] | None:
    if tokens is None:
        return None
    ids = [int(t) for t in tokens]
    return "-1" if ids == [-1] else ids


def engine_options(options: TranscriptionOptions, language: str | None, task: str) -> dict[str, Any]:
    """The keywords of whisperkv's job (``TranscribeOptions.from_dict``) for these options."""
    greedy = options.beam_size == 1
    return {
        "verbose": None,
        "temperature": options.temperatures,
        "compression_ratio_threshold": options.compression_ratio_threshold,
        "logprob_threshold": options.log_prob_threshold,
        "no_speech_threshold": options.no_speech_threshold,
        "condition_on_previous_text": options.condition_on_previous_text,
        # token ids are put in by the job (``FasterJob``); whisperkv's loop takes text
        "initial_prompt": options.initial_prompt if isinstance(options.initial_prompt, str) else None,
        "word_timestamps": options.word_timestamps,
        "prepend_punctuations": options.prepend_punctuations,
        "append_punctuations": options.append_punctuations,
        "clip_timestamps": options.clip_timestamps,
        "hallucination_silence_threshold": options.hallucination_silence_threshold,
        "language": language,
        "task": task,
        "beam_size": None if greedy else options.beam_size,
        "patience": None if greedy or options.patience == 1 else float(options.patience),
        "best_of": options.best_of,
        "prefix": options.prefix,
        "hotwords": options.hotwords,
        "suppress_tokens": suppress_tokens(options.suppress_tokens),
        "suppress_blank": options.suppress_blank,
        "without_timestamps": options.without_timestamps,
        "max_initial_timestamp": options.max_initial_timestamp,
        "sample_len": options.max_new_tokens,
    }
