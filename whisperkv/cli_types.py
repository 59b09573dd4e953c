"""argparse types of the command line: a value that cannot be parsed is refused by argparse, naming the
option, in one usage line (exit 2) before any work.

Shared by every command's parser (``cli_options.py``, ``serve/``, ``stream/``, ``batch/``, ``explain/``);
they need nothing but the language table, so any command module may import them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from whisperkv.tokenizer import LANGUAGES, TO_LANGUAGE_CODE


def str2bool(value: str) -> bool:
    """True or False, spelt exactly so (openai-whisper's ``str2bool``: "yes" or "true" are refused, so a
    command line means the same to both programs)."""
    if value == "True":
        return True
    if value == "False":
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


def optional(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """``kind``, or None for the text "None" (openai-whisper's spelling of "unset")."""

    def parse(value: str):
        return None if value.strip().lower() == "none" else kind(value)

    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1 (a bad value is a one-line usage error)."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def non_negative_number(text: str) -> float:
    value = number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value:g}")
    return value


def positive_number(text: str) -> float:
    value = number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {value:g}")
    return value


def probability(text: str) -> float:
    """argparse type: a probability above 0, at most 1."""
    value = number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {value:g}")
    return value


def language(text: str) -> str:
    """A language code ("de") or English name ("German"); returns the code."""
    key = text.strip().lower()
    if key in LANGUAGES:
        return key
    if key in TO_LANGUAGE_CODE:
        return TO_LANGUAGE_CODE[key]
    raise argparse.ArgumentTypeError(
        f"unknown language {text!r}: give a code such as en, de, fr, zh or an English name such as German"
    )
