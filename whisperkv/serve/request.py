"""The OpenAI audio request: form fields -> what to run (``transcribe()`` options) and how to answer.

OpenAI's fields keep OpenAI's meaning (``prompt`` is the initial prompt, ``temperature`` 0 is the fallback
schedule, ``timestamp_granularities[]`` asks for segments and/or words). Every other field must be one of
openai-whisper's decoding options, by its name, parsed to its type; anything else is a 400 naming the field.
Defaults are ``transcribe()``'s (greedy with the fallback schedule), not the CLI's beam 5.

Every option then goes through ``whisperkv.options_check``, the checker ``transcribe()`` and the CLI use,
and through the server's ``RequestLimits`` (``whisperkv.serve.limits``): what the form lets through is
what ``transcribe()`` would accept, within what this server will spend on one request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, UploadFile

from whisperkv.options_check import OptionError, check_transcribe_options, fallback_schedule
from whisperkv.serve.errors import APIError
from whisperkv.serve.limits import check_limits, check_prompt_tokens
from whisperkv.serve.settings import RequestLimits
from whisperkv.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("segment", "word")


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _optional(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        return None if text.strip().lower() in ("none", "null", "") else kind(text)

    return parse


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _finite(text: str) -> float:
    """A number, but never nan or inf (``float`` alone takes both)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


#: openai-whisper's options accepted as extra form fields, each with its parser
WHISPER_OPTIONS: dict[str, Callable[[str], Any]] = {
    "beam_size": _optional(_positive_int),
    "best_of": _optional(_positive_int),
    "patience": _optional(_finite),
    "length_penalty": _optional(_finite),
    "sample_len": _optional(_positive_int),
    "suppress_tokens": str,
    "suppress_blank": _bool,
    "without_timestamps": _bool,
    "max_initial_timestamp": _optional(_finite),
    "prefix": str,
    "fp16": _bool,
    "condition_on_previous_text": _bool,
    "carry_initial_prompt": _bool,
    "compression_ratio_threshold": _optional(_finite),
    "logprob_threshold": _optional(_finite),
    "no_speech_threshold": _optional(_finite),
    "word_timestamps": _bool,
    "prepend_punctuations": str,
    "append_punctuations": str,
    "clip_timestamps": str,
    "hallucination_silence_threshold": _optional(_finite),
    "initial_prompt": str,
    "temperature_increment_on_fallback": _optional(_finite),
    "hotwords": str,
}
OPENAI_FIELDS = ("file", "model", "language", "prompt", "response_format", "temperature", "stream")
GRANULARITY_FIELDS = ("timestamp_granularities[]", "timestamp_granularities")


@dataclass
class AudioRequest:
    """One parsed request: the form's file, what to run, and the response it wants."""

    upload: UploadFile
    model: str
    task: str
    response_format: str = "json"
    stream: bool = False
    granularities: tuple[str, ...] = ()
    #: keyword options for transcribe() (only what the request set; the rest keeps transcribe's defaults)
    options: dict[str, Any] = field(default_factory=dict)
    #: the form field that gave an option, where the names differ (OpenAI's ``prompt``)
    params: dict[str, str] = field(default_factory=dict)

    @property
    def wants_words(self) -> bool:
        return bool(self.options.get("word_timestamps"))


#: the most characters of a client's value an error message repeats back
SHOWN_CHARS = 40


def _shown(text: str) -> str:
    """A client's value as an error message quotes it: repr'd, and cut (a field may be a megabyte)."""
    return repr(text) if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]!r}... ({len(text):,} characters)"


def _single(form: FormData, name: str) -> str | None:
    values = form.getlist(name)
    if not values:
        return None
    if len(values) > 1:
        raise APIError(400, f"'{name}' was given {len(values)} times; give it once", param=name)
    if not isinstance(values[0], str):
        raise APIError(400, f"'{name}' must be a text field, not a file", param=name)
    return values[0]


def _parse(name: str, text: str, parser: Callable[[str], Any]) -> Any:
    try:
        return parser(text)
    except ValueError as err:
        reason = str(err) if "expected" in str(err) or "must" in str(err) else "invalid value"
        raise APIError(400, f"invalid value {_shown(text)} for '{name}': {reason}", param=name) from None


def _temperature(
    temperature: float, increment: float | None, increment_given: bool, max_temperatures: int
) -> Any:
    """OpenAI's meaning: 0 is the fallback schedule; above 0 samples at that temperature only.
    An explicit ``temperature_increment_on_fallback`` builds the CLI's schedule from ``temperature``,
    its length checked (``--max_temperatures``) before it is built."""
    if not 0.0 <= temperature <= 1.0:
        raise APIError(400, f"temperature must be between 0 and 1, got {temperature}", param="temperature")
    if increment_given:
        if increment is None:
            return temperature
        note = " (whisperkv serve --max_temperatures)"
        try:
            return fallback_schedule(temperature, increment, max_temperatures, note)
        except OptionError as err:
            raise option_error(err) from None
    return None if temperature == 0.0 else temperature  # None: transcribe()'s default schedule


def option_error(err: OptionError, params: Mapping[str, str] | None = None) -> APIError:
    """The checker's refusal as a 400 naming the form field (``prompt`` for the option initial_prompt)."""
    param = (params or {}).get(err.option, err.option)
    return APIError(400, f"{param}: {err.reason}", param=param)


def _check_file_name(upload: UploadFile) -> None:
    name = upload.filename or ""
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise APIError(400, "the file's name holds a control character (such as NUL)", param="file")


def _language(text: str, multilingual: bool) -> str:
    code = text.strip().lower()
    code = TO_LANGUAGE_CODE.get(code, code)
    if code not in LANGUAGES:
        raise APIError(
            400, f"unknown language {_shown(text)} (use an ISO-639-1 code such as 'en')", param="language"
        )
    if not multilingual and code != "en":
        raise APIError(
            400,
            f"the served model is English-only; language {_shown(text)} needs a multilingual model",
            param="language",
        )
    return code


def parse_audio_request(
    form: FormData,
    *,
    task: str,
    served_names: Iterable[str],
    multilingual: bool,
    limits: RequestLimits | None = None,
) -> AudioRequest:
    """Check and convert every field; raise APIError (400 / 404) naming the first field that is wrong.

    ``limits`` (default: ``RequestLimits()``) bounds the work asked; the checks that need the model are
    ``check_with_model``'s.
    """
    limits = limits or RequestLimits()
    known = set(OPENAI_FIELDS) | set(GRANULARITY_FIELDS) | set(WHISPER_OPTIONS)
    for name in form.keys():
        if name not in known:
            raise APIError(400, f"unknown parameter '{name}'", param=name, code="unknown_parameter")

    request = AudioRequest(upload=_upload(form), model=_model(form, served_names), task=task)
    options: dict[str, Any] = {}
    if task == "translate":
        if not multilingual:
            raise APIError(
                400,
                "the served model is English-only and cannot translate; serve a multilingual "
                "model (--model base)",
                param="model",
            )
        options["task"] = "translate"

    response_format = _single(form, "response_format")
    if response_format is not None:
        if response_format not in RESPONSE_FORMATS:
            raise APIError(
                400,
                f"response_format must be one of {', '.join(RESPONSE_FORMATS)}; "
                f"got {_shown(response_format)}",
                param="response_format",
            )
        request.response_format = response_format
    stream = _single(form, "stream")
    request.stream = bool(stream is not None and _parse("stream", stream, _bool))
    language = _single(form, "language")
    if language is not None:
        options["language"] = _language(language, multilingual)

    prompt, initial = _single(form, "prompt"), _single(form, "initial_prompt")
    if prompt is not None and initial is not None:
        raise APIError(400, "give 'prompt' or 'initial_prompt', not both", param="initial_prompt")
    if (prompt if prompt is not None else initial) is not None:
        options["initial_prompt"] = prompt if prompt is not None else initial
        if prompt is not None:
            request.params["initial_prompt"] = "prompt"

    for name, parser in WHISPER_OPTIONS.items():
        if name in ("initial_prompt", "temperature_increment_on_fallback"):
            continue
        text = _single(form, name)
        if text is not None:
            options[name] = _parse(name, text, parser)

    schedule = _schedule(form, limits.max_temperatures)
    if schedule is not None:
        options["temperature"] = schedule
    _granularities(form, request, options)
    request.options = options
    check_limits(options, limits, request.params)
    try:
        check_transcribe_options(None, options)  # what needs no model: the CLI's and transcribe()'s checks
    except OptionError as err:
        raise option_error(err, request.params) from None
    return request


def _upload(form: FormData) -> UploadFile:
    files = form.getlist("file")
    if not files:
        raise APIError(400, "missing required parameter 'file'", param="file")
    if len(files) > 1 or not isinstance(files[0], UploadFile):
        raise APIError(400, "'file' must be exactly one uploaded file", param="file")
    _check_file_name(files[0])
    return files[0]


def _model(form: FormData, served_names: Iterable[str]) -> str:
    model = _single(form, "model")
    if model is None:
        raise APIError(400, "missing required parameter 'model'", param="model")
    if model not in served_names:
        names = ", ".join(repr(n) for n in served_names)
        raise APIError(
            404,
            f"the model {_shown(model)} does not exist; this server serves {names}",
            param="model",
            code="model_not_found",
        )
    return model


def _schedule(form: FormData, max_temperatures: int) -> Any:
    """``temperature`` and ``temperature_increment_on_fallback`` as transcribe()'s ``temperature``."""
    temperature_text = _single(form, "temperature")
    temperature = 0.0 if temperature_text is None else _parse("temperature", temperature_text, _finite)
    increment_text = _single(form, "temperature_increment_on_fallback")
    increment = None
    if increment_text is not None:
        increment = _parse(
            "temperature_increment_on_fallback",
            increment_text,
            WHISPER_OPTIONS["temperature_increment_on_fallback"],
        )
    return _temperature(temperature, increment, increment_text is not None, max_temperatures)


def _granularities(form: FormData, request: AudioRequest, options: dict[str, Any]) -> None:
    """``timestamp_granularities[]``: the response's parts; "word" turns word timestamps on."""
    granularities = [*form.getlist("timestamp_granularities[]"), *form.getlist("timestamp_granularities")]
    for value in granularities:
        if value not in GRANULARITIES:
            raise APIError(
                400,
                f"timestamp_granularities must be 'segment' or 'word', got {_shown(str(value))}",
                param="timestamp_granularities",
            )
    if granularities and request.response_format != "verbose_json":
        raise APIError(
            400, "timestamp_granularities needs response_format=verbose_json", param="timestamp_granularities"
        )
    request.granularities = tuple(dict.fromkeys(granularities))
    if "word" in request.granularities:
        if options.get("word_timestamps") is False:
            raise APIError(
                400,
                "timestamp_granularities 'word' contradicts word_timestamps=false",
                param="word_timestamps",
            )
        options["word_timestamps"] = True


async def check_with_model(request: AudioRequest, model: Any, limits: RequestLimits | None = None) -> None:
    """The checks that need the served model: token ids against its vocabulary, ``sample_len`` against
    its text context, prompt tokens against ``--max_prompt_tokens`` (tokenizing: in a worker thread)."""

    def check() -> None:
        try:
            check_transcribe_options(model, request.options)
        except OptionError as err:
            raise option_error(err, request.params) from None
        check_prompt_tokens(request.options, model.tokenizer, limits or RequestLimits(), request.params)

    await run_in_threadpool(check)
