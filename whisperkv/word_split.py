"""Tokens grouped into words, for word-level timestamps: the reference's two rules.

Spaced languages split before tokens that start with a space, are punctuation, or are special;
unspaced ones (zh, ja, th, lo, my, yue) split wherever a whole UTF-8 character has been completed.
Every token lands in exactly one group, in order, so word timings line up with the reference's.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from whisperkv.tokenizer import Tokenizer


def split_on_characters(tokenizer: Tokenizer, ids: Sequence[int]) -> tuple[list[str], list[list[int]]]:
    """Cut after each token that completes a UTF-8 character.

    A group's text containing U+FFFD means its bytes are cut mid-character, unless the full
    decoding has U+FFFD at the same place too (the bytes were genuinely invalid): then it is done.
    """
    full = tokenizer.decode_with_timestamps(ids)
    words: list[str] = []
    groups: list[list[int]] = []
    group: list[int] = []
    pending = b""
    offset = 0  # characters of `full` already emitted
    for token_id in ids:
        group.append(int(token_id))
        pending += tokenizer.token_bytes(token_id)
        text = pending.decode("utf-8", errors="replace")
        bad = text.find("\ufffd")
        if bad < 0 or full[offset + bad : offset + bad + 1] == "\ufffd":
            words.append(text)
            groups.append(group)
            offset += len(text)
            group, pending = [], b""
    if group:  # unreachable for well-formed input; never lose tokens
        words.append(pending.decode("utf-8", errors="replace"))
        groups.append(group)
    return words, groups


def split_on_spaces(tokenizer: Tokenizer, ids: Sequence[int]) -> tuple[list[str], list[list[int]]]:
    words: list[str] = []
    groups: list[list[int]] = []
    for text, group in zip(*split_on_characters(tokenizer, ids), strict=True):
        starts_word = (
            not words
            or group[0] >= tokenizer.eot
            or text.startswith(" ")
            # A substring test, as in the reference: "" and runs such as "()" count as punctuation,
            # "..." does not. Kept identical so word timings line up with the reference.
            or text.strip() in string.punctuation
        )
        if starts_word:
            words.append(text)
            groups.append(list(group))
        else:
            words[-1] += text
            groups[-1].extend(group)
    return words, groups
