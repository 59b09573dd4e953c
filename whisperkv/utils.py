"""``whisper.utils``' names that callers use: the writers (``get_writer``) and timestamp formatting.

The writers themselves live in ``writers.py``; here ``get_writer`` takes the reference's call shape too:
``writer(result, audio_path, options)`` or ``writer(result, audio_path, **options)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from whisperkv.decoding.options import compression_ratio
from whisperkv.writers import SUPPORTED_FORMATS, format_timestamp
from whisperkv.writers import get_writer as _get_writer

__all__ = ["SUPPORTED_FORMATS", "compression_ratio", "format_timestamp", "get_writer"]


def get_writer(output_format: str, output_dir: str) -> Callable[..., None]:
    """A writer of ``<output_dir>/<audio stem>.<format>`` ("txt", "vtt", "srt", "tsv", "json" or "all").

    Options (``max_line_width``, ``max_line_count``, ``highlight_words``, ``max_words_per_line``) come as
    a dict, as keywords (the reference's command line passes them so), or both.
    """
    write = _get_writer(output_format, output_dir)

    def write_result(
        result: dict, audio_path: str, options: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        write(result, audio_path, {**(options or {}), **kwargs})

    return write_result
