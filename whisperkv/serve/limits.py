"""The work one request may ask for, against the server's ``RequestLimits``: over a limit is a 400 naming
the option, the limit and the ``serve`` flag that sets it.

Numbers and text lengths are checked as soon as the form is parsed (before any audio is decoded); prompt
tokens once the model's tokenizer is at hand, and only for text already short enough in characters, so
tokenizing a huge string (time quadratic in the length of one long word) can never be the attack.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any

from whisperkv.options_check import parse_numbers
from whisperkv.serve.errors import APIError
from whisperkv.serve.settings import RequestLimits

#: text over this many characters per allowed token is refused before it is tokenized (ordinary text is
#: 3-5 characters a token)
PROMPT_CHARS_PER_TOKEN = 6
#: the options whose text becomes decoder prompt tokens in every window
PROMPT_OPTIONS = ("initial_prompt", "prefix", "hotwords")
#: option -> the RequestLimits field that bounds it (its ``serve`` flag has the same name)
_COUNT_LIMITS = {
    "beam_size": "max_beam_size",
    "best_of": "max_best_of",
    "sample_len": "max_sample_len",
}
LIMIT_CODE = "over_limit"


#: RequestLimits field (and ``serve`` flag) -> what its help says it bounds
_FLAG_HELP = {
    "max_beam_size": "most beams a request may ask for (beam_size)",
    "max_best_of": "most samples a request may ask for (best_of)",
    "max_temperatures": "most temperatures in a request's fallback schedule",
    "max_prompt_tokens": "most tokens in a request's prompt, prefix or hotwords, each",
    "max_sample_len": "most tokens a request may have sampled per window (sample_len)",
}


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """``--max_beam_size`` and the other RequestLimits, each a whole number of at least 1; a bad value
    (nan, negative, not a number) is a usage error naming the flag, exit 2, before the model loads."""
    from whisperkv.cli_options import positive_int

    defaults = RequestLimits()
    for name, help_text in _FLAG_HELP.items():
        default = getattr(defaults, name)
        help_text = f"{help_text}; more is a 400 (default: {default})"
        parser.add_argument(f"--{name}", type=positive_int, default=default, help=help_text)


def limits_from_args(args: argparse.Namespace) -> RequestLimits:
    """The RequestLimits the ``serve`` flags set."""
    return RequestLimits(**{f.name: getattr(args, f.name) for f in fields(RequestLimits)})


def over_limit(param: str, asked: str, allowed: str, limit_name: str) -> APIError:
    """A 400 that says what was asked, the limit, and the flag that sets it."""
    return APIError(
        400,
        f"{param}: {asked} asked; this server allows at most {allowed} (whisperkv serve --{limit_name})",
        param=param,
        code=LIMIT_CODE,
    )


def check_limits(options: Mapping[str, Any], limits: RequestLimits, params: Mapping[str, str]) -> None:
    """Refuse a count over its limit or prompt text too long to be under the token limit.

    ``params`` maps an option to the form field that gave it, where they differ (``prompt``).
    """
    for name, limit_name in _COUNT_LIMITS.items():
        value = options.get(name)
        limit = getattr(limits, limit_name)
        if isinstance(value, int) and value > limit:
            raise over_limit(params.get(name, name), str(value), str(limit), limit_name)
    schedule = options.get("temperature")
    if isinstance(schedule, tuple) and len(schedule) > limits.max_temperatures:
        asked, allowed = f"{len(schedule)} temperatures", str(limits.max_temperatures)
        raise over_limit("temperature_increment_on_fallback", asked, allowed, "max_temperatures")
    max_chars = limits.max_prompt_tokens * PROMPT_CHARS_PER_TOKEN
    for name in PROMPT_OPTIONS:
        text = options.get(name)
        if isinstance(text, str) and len(text) > max_chars:
            asked = f"{len(text):,} characters"
            allowed = f"{limits.max_prompt_tokens} tokens, {max_chars:,} characters"
            raise over_limit(params.get(name, name), asked, allowed, "max_prompt_tokens")


def check_prompt_tokens(
    options: Mapping[str, Any], tokenizer: Any, limits: RequestLimits, params: Mapping[str, str]
) -> None:
    """Refuse prompt text of more tokens than the limit, counted as the decoder encodes it.

    Blocking (up to ~``max_prompt_tokens * PROMPT_CHARS_PER_TOKEN`` characters to tokenize): run it in a
    worker thread, after ``check_limits``.
    """
    for name in PROMPT_OPTIONS:
        text = options.get(name)
        if isinstance(text, str):
            count = len(tokenizer.encode(" " + text.strip()))
            if count > limits.max_prompt_tokens:
                asked, allowed = f"{count} tokens", f"{limits.max_prompt_tokens} tokens"
                raise over_limit(params.get(name, name), asked, allowed, "max_prompt_tokens")


#: seconds of audio one decoder window covers
WINDOW_S = 30.0


def check_clip_work(clips: str | Iterable[Any], duration_s: float, max_audio_s: float) -> None:
    """Refuse clips that ask for more windows than the longest upload allowed (``--max_audio_s``) would.

    Clips may overlap and each costs at least one window however short, so ``0,1,0,1,...`` in a
    megabyte of form field would otherwise decode the same second a quarter of a million times.
    """
    points = parse_numbers("clip_timestamps", clips)
    starts, ends = points[::2], [*points[1::2], duration_s]
    windows = sum(
        max(1, math.ceil((min(end, duration_s) - start) / WINDOW_S)) for start, end in zip(starts, ends)
    )
    allowed = math.ceil(max_audio_s / WINDOW_S)
    if windows > allowed:
        asked = f"clips of {windows:,} windows of {WINDOW_S:g} s"
        raise over_limit("clip_timestamps", asked, f"{allowed:,} windows", "max_audio_s")
