"""Check transcription options before any work, so a bad value is refused naming the option.

The CLI and the Python API take the same options. Checking them here, once, means ``--beam_size 0`` and
``transcribe(audio, beam_size=0)`` are refused the same way, before audio is read or a model runs,
instead of failing deep inside decoding (an empty temperature schedule, a negative sample count, a
token id outside the vocabulary) or being silently accepted.

``@checked_options`` wraps ``transcribe()`` so the check happens at its top whatever its body does.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from whisperkv.decoding.options import DecodingOptions
from whisperkv.errors import WhisperKVError
from whisperkv.tokenizer import LANGUAGES, TASKS, TO_LANGUAGE_CODE

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper

F = TypeVar("F", bound=Callable[..., Any])


class OptionError(WhisperKVError, ValueError):
    """An option has a value it cannot take. ``option`` is its name, ``reason`` says what is wrong."""

    def __init__(self, option: str, reason: str) -> None:
        self.option = option
        self.reason = reason
        super().__init__(f"option {option}: {reason}")


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def _number(name: str, value: Any) -> float:
    if _is_bool(value) or not isinstance(value, Real):
        raise OptionError(name, f"expected a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise OptionError(name, f"must be a finite number, got {value}")
    return value


def _at_least(name: str, value: Any, low: float, *, strict: bool = False) -> float:
    value = _number(name, value)
    if value < low or (strict and value == low):
        raise OptionError(name, f"must be {'above' if strict else 'at least'} {low:g}, got {value:g}")
    return value


def _between(name: str, value: Any, low: float, high: float) -> float:
    value = _number(name, value)
    if not low <= value <= high:
        raise OptionError(name, f"must be between {low:g} and {high:g}, got {value:g}")
    return value


def _fail(name: str, reason: str) -> None:
    raise OptionError(name, reason)


def _count(name: str, value: Any, low: int = 1) -> int:
    if _is_bool(value) or not isinstance(value, Integral):
        raise OptionError(name, f"expected a whole number, got {value!r}")
    if value < low:
        raise OptionError(name, f"must be at least {low}, got {value}")
    return int(value)


def _flag(name: str, value: Any, *, none_ok: bool = False) -> None:
    if not (_is_bool(value) or (none_ok and value is None)):
        raise OptionError(name, f"expected True or False, got {value!r}")


def _text(name: str, value: Any, *, none_ok: bool = True) -> None:
    if not (isinstance(value, str) or (none_ok and value is None)):
        raise OptionError(name, f"expected text, got {type(value).__name__}")


def parse_numbers(name: str, value: str | Iterable[Any], kind: type = float) -> list:
    """Comma-separated text ("1,2.5") or a sequence, as a list of ``kind``; a bad item names the option."""
    items = [t.strip() for t in value.split(",") if t.strip()] if isinstance(value, str) else list(value)
    out = []
    for item in items:
        try:
            if isinstance(item, str):
                number = kind(item)
            elif _is_bool(item) or not isinstance(item, Integral if kind is int else Real):
                raise TypeError
            else:
                number = kind(item)
        except (TypeError, ValueError):
            what = "a whole number" if kind is int else "a number"
            raise OptionError(name, f"{item!r} is not {what}") from None
        if kind is float and not math.isfinite(number):
            raise OptionError(name, f"{item!r} is not a finite number")
        out.append(number)
    return out


def temperature_schedule(value: float | Iterable[float]) -> list[float]:
    """The temperatures to try in turn: one number or a non-empty sequence, each finite and ≥ 0."""
    items = [value] if isinstance(value, Real) or _is_bool(value) else list(value)
    if not items:
        raise OptionError("temperature", "the schedule is empty: give at least one temperature")
    return [_at_least("temperature", t, 0.0) for t in items]


#: the most temperatures a fallback schedule built from an increment may hold (0.001 steps from 0 give
#: 1,001); a smaller step would build a schedule of millions before any work (``--temperature 0
#: --temperature_increment_on_fallback 1e-6``), so it is refused by arithmetic, before building it
MAX_FALLBACK_TEMPERATURES = 1001
#: the last temperature a schedule built from an increment reaches (openai-whisper's ``1.0 + 1e-6``)
_SCHEDULE_END = 1.0 + 1e-6


def fallback_schedule(
    start: float, increment: float | None, max_count: int = MAX_FALLBACK_TEMPERATURES, limit_note: str = ""
) -> tuple[float, ...]:
    """``start``, then ``start + increment``... up to 1.0 (openai-whisper's schedule); a start above 1.0,
    or no increment, is tried alone.

    The length is checked before the schedule is built: more than ``max_count`` temperatures is an
    ``OptionError`` naming ``temperature_increment_on_fallback`` (``limit_note`` says whose limit it is).
    """
    start = _at_least("temperature", start, 0.0)
    if increment is None or start > 1.0:
        return (start,)
    increment = _at_least("temperature_increment_on_fallback", increment, 0.0, strict=True)
    estimate = (_SCHEDULE_END - start) / increment + 1  # a float (inf for a subnormal step)
    if estimate >= max_count + 1:  # the float sum below may make one more than the estimate's floor
        raise _too_many_temperatures(start, increment, estimate, max_count, limit_note)
    values, t = [], start
    while t <= _SCHEDULE_END:
        values.append(round(t, 10))
        t += increment
    if len(values) > max_count:
        raise _too_many_temperatures(start, increment, len(values), max_count, limit_note)
    return tuple(values)


def _too_many_temperatures(start: float, step: float, count: float, limit: int, note: str) -> OptionError:
    shown = f"{math.floor(count):,}" if count < 1e9 else "over a billion"
    return OptionError(
        "temperature_increment_on_fallback",
        f"a step of {step:g} from {start:g} to 1 makes {shown} temperatures; "
        f"at most {limit} are allowed{note}",
    )


def check_clips_within(value: str | Iterable[Any], duration_s: float) -> None:
    """Refuse clips that start at or past the end of ``duration_s`` seconds of audio (they hold nothing)."""
    points = parse_numbers("clip_timestamps", value)
    for start in points[::2]:
        if start >= duration_s:
            raise OptionError(
                "clip_timestamps",
                f"clip start {start:g} s is not before the end of the audio ({duration_s:g} s)",
            )


def _check_clips(value: str | Iterable[Any]) -> None:
    points = parse_numbers("clip_timestamps", value)
    for point in points:
        if point < 0:
            raise OptionError("clip_timestamps", f"times must be at least 0 s, got {point:g}")
    for start, end in zip(points[::2], points[1::2]):
        if end <= start:
            raise OptionError("clip_timestamps", f"clip end {end:g} s is not after its start {start:g} s")


def _check_suppress_tokens(value: Any, n_vocab: int | None) -> None:
    if value is None:
        return
    for token in parse_numbers("suppress_tokens", value, int):
        if token < -1 or (n_vocab is not None and token >= n_vocab):
            limit = f" and below {n_vocab}" if n_vocab is not None else ""
            raise OptionError("suppress_tokens", f"token id {token} is not -1 or 0{limit}")


def _check_sample_len(value: Any, n_text_ctx: int | None) -> None:
    count = _count("sample_len", value)
    if n_text_ctx is not None and count > n_text_ctx:
        raise OptionError(
            "sample_len", f"must be at most {n_text_ctx} (the model's text context), got {count}"
        )


def _check_language(value: Any) -> None:
    if value is None:
        return
    _text("language", value)
    key = value.strip().lower()
    if key not in LANGUAGES and key not in TO_LANGUAGE_CODE:
        raise OptionError("language", f"unknown language {value!r} (a code such as en or de, or a name)")


def _check_prompt(name: str, value: Any) -> None:
    if value is None or isinstance(value, str):
        return
    parse_numbers(name, value, int)  # a list of token ids


_DECODING_FIELDS = frozenset(f.name for f in fields(DecodingOptions))


def _checks(n_vocab: int | None, n_text_ctx: int | None = None) -> dict[str, Callable[[Any], Any]]:
    """One check per option name; each raises ``OptionError`` or returns. ``n_vocab`` and ``n_text_ctx``
    (a model's, when known) bound token ids and the tokens to sample."""
    return {
        "verbose": lambda v: _flag("verbose", v, none_ok=True),
        "temperature": temperature_schedule,
        "compression_ratio_threshold": lambda v: v is None or _at_least("compression_ratio_threshold", v, 0),
        "logprob_threshold": lambda v: v is None or _number("logprob_threshold", v),
        "no_speech_threshold": lambda v: v is None or _between("no_speech_threshold", v, 0, 1),
        "condition_on_previous_text": lambda v: _flag("condition_on_previous_text", v),
        "initial_prompt": lambda v: _text("initial_prompt", v),
        "carry_initial_prompt": lambda v: _flag("carry_initial_prompt", v),
        "word_timestamps": lambda v: _flag("word_timestamps", v),
        "prepend_punctuations": lambda v: _text("prepend_punctuations", v, none_ok=False),
        "append_punctuations": lambda v: _text("append_punctuations", v, none_ok=False),
        "clip_timestamps": _check_clips,
        "hallucination_silence_threshold": lambda v: (
            v is None or _at_least("hallucination_silence_threshold", v, 0, strict=True)
        ),
        # DecodingOptions fields that are not plain switches
        "task": lambda v: v in TASKS or _fail("task", f"expected one of {', '.join(TASKS)}, got {v!r}"),
        "language": _check_language,
        "sample_len": lambda v: v is None or _check_sample_len(v, n_text_ctx),
        "best_of": lambda v: v is None or _count("best_of", v),
        "beam_size": lambda v: v is None or _count("beam_size", v),
        "patience": lambda v: v is None or _at_least("patience", v, 0, strict=True),
        "length_penalty": lambda v: v is None or _between("length_penalty", v, 0, 1),
        "prompt": lambda v: _check_prompt("prompt", v),
        "prefix": lambda v: _check_prompt("prefix", v),
        "suppress_tokens": lambda v: _check_suppress_tokens(v, n_vocab),
        "max_initial_timestamp": lambda v: v is None or _at_least("max_initial_timestamp", v, 0),
        "hotwords": lambda v: _text("hotwords", v),
        # where windows are encoded (None: here; a boundary.RemoteEncoder) and whether costs are reported
        "encoder": lambda v: v is None or hasattr(v, "encode") or _fail("encoder", f"has no encode(): {v!r}"),
        "report_costs": lambda v: _flag("report_costs", v),
    }


#: every option name this module knows how to check
CHECKED_OPTIONS = frozenset(_checks(None)) | _DECODING_FIELDS


def check_transcribe_options(
    model: Whisper | None = None, options: Mapping[str, Any] | None = None, **more: Any
) -> None:
    """Raise ``OptionError`` for the first option (openai-whisper's names) whose value is invalid.

    ``model``, when given, bounds token ids by its vocabulary and ``sample_len`` by its text context
    (no more tokens than that can ever be sampled). Options not given are not checked;
    a name that is neither a transcribe option nor a ``DecodingOptions`` field is refused.
    """
    given = {**(options or {}), **more}
    dims = model.dims if model is not None else None
    checks = _checks(dims.n_vocab if dims else None, dims.n_text_ctx if dims else None)
    for name, value in given.items():
        if name in checks:
            checks[name](value)
        elif name in _DECODING_FIELDS:
            _flag(name, value)  # the remaining fields are all switches
        else:
            raise OptionError(name, "unknown option")
    temperatures = temperature_schedule(given.get("temperature", 0.0))
    if given.get("patience") is not None and given.get("beam_size") is None and 0.0 in temperatures:
        raise OptionError("patience", "needs beam_size (patience applies to beam search)")


def checked_options(transcribe: F) -> F:
    """Decorate ``transcribe(model, audio, **options)`` so its options are checked before it runs."""
    signature = inspect.signature(transcribe)

    @functools.wraps(transcribe)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        options: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                options.update(value)  # free-form: every name must be a known option
            elif kind is inspect.Parameter.KEYWORD_ONLY and name in CHECKED_OPTIONS:
                options[name] = value
        check_transcribe_options(bound.arguments.get("model"), options)
        return transcribe(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
