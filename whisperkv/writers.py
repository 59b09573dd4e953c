"""Output writers for a transcription result: txt, vtt, srt, tsv and json.

The formats are byte-for-byte those of openai-whisper's writers, so files written by whisperkv can be
diffed against the reference and consumed by the same downstream tools. Two things differ on purpose:

* every file is written atomically (a temporary file in the same directory, then ``os.replace``), so a
  crash or an unserialisable value never leaves a truncated subtitle or JSON file behind, and an older
  output survives a failed rewrite;
* the JSON writer converts tensors and numpy values (``.tolist()``) instead of raising, because the
  engine's results may carry them in its extra keys ("cache", "language_probs").

Rendering (result -> text) is separated from writing, so ``render`` can be used without touching disk
and ``"all"`` renders every format before writing any of them.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SUPPORTED_FORMATS",
    "format_timestamp",
    "get_writer",
    "render",
    "write_atomic",
]

SUPPORTED_FORMATS: tuple[str, ...] = ("txt", "vtt", "srt", "tsv", "json")

#: the options a writer reads; unknown keys are ignored, so the CLI can pass all its arguments
Options = Mapping[str, Any]
Writer = Callable[[dict, str, Options | None], None]

#: two consecutive word *starts* further apart than this begin a new subtitle (line-splitting mode only)
LONG_PAUSE_S = 3.0
#: what an unset line width / words-per-line limit means: effectively unlimited, as in the reference
_UNLIMITED = 1000


def format_timestamp(seconds: float, always_include_hours: bool = False, decimal_marker: str = ".") -> str:
    """``[HH:]MM:SS.mmm`` with milliseconds rounded (half to even, like Python's ``round``).

    Hours appear when asked for (SRT) or when non-zero, so a VTT file switches to the long form only
    after the first hour, exactly as the reference does.
    """
    seconds = float(seconds)  # tensors and numpy scalars: compute in Python floats like the reference
    if not seconds >= 0:  # also rejects NaN
        raise ValueError(f"non-negative timestamp expected, got {seconds!r}")
    total_ms = round(seconds * 1000.0)
    hours, rest = divmod(total_ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, millis = divmod(rest, 1_000)
    prefix = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{prefix}{minutes:02d}:{secs:02d}{decimal_marker}{millis:03d}"


# ---------------------------------------------------------------------------------------------------
# subtitles (vtt, srt)


@dataclass(frozen=True)
class _SubtitleLayout:
    """The four subtitle options, with the reference's meaning of "unset" applied."""

    #: keep each Whisper segment (or each chunk of max_words_per_line words) as its own subtitle.
    #: True unless BOTH a line width and a line count are given; then words are re-flowed freely and
    #: max_words_per_line has no effect (the reference CLI warns about that combination too).
    preserve_segments: bool
    max_line_width: int
    max_line_count: int | None
    max_words_per_line: int
    highlight_words: bool

    @classmethod
    def from_options(cls, options: Options | None) -> _SubtitleLayout:
        options = options or {}
        width = options.get("max_line_width")
        count = options.get("max_line_count")
        per_line = options.get("max_words_per_line")
        if per_line is not None and per_line < 0:
            # the reference would loop forever stepping through a segment's words backwards
            raise ValueError(f"max_words_per_line must be positive, got {per_line}")
        return cls(
            # decided on "is None", before 0 is turned into the default just below (as the reference)
            preserve_segments=count is None or width is None,
            max_line_width=width or _UNLIMITED,
            max_line_count=count,
            max_words_per_line=per_line or _UNLIMITED,
            highlight_words=bool(options.get("highlight_words", False)),
        )


def _group_words(segments: list[dict], layout: _SubtitleLayout) -> Iterator[list[dict]]:
    """Flow word timings into subtitles; each yielded subtitle is a list of (copied) word timings.

    A word's "word" text keeps its leading space when it continues a line; a word that starts a line is
    stripped, and prefixed with "\\n" when it starts a second or later line of the same subtitle.
    """
    subtitle: list[dict] = []
    line_len = 0  # characters on the current line
    line_count = 1  # lines in the current subtitle
    previous_start: float | None = None
    for segment in segments:
        words = segment["words"]
        for chunk_start in range(0, len(words), layout.max_words_per_line):
            chunk = words[chunk_start : chunk_start + layout.max_words_per_line]
            for position, original in enumerate(chunk):
                timing = dict(original)
                text = timing["word"]
                # a pause is measured between word starts, not from the previous word's end
                long_pause = (
                    not layout.preserve_segments
                    and previous_start is not None
                    and timing["start"] - previous_start > LONG_PAUSE_S
                )
                chunk_break = layout.preserve_segments and position == 0 and len(subtitle) > 0
                fits = line_len + len(text) <= layout.max_line_width
                if line_len > 0 and fits and not long_pause and not chunk_break:
                    line_len += len(text)  # continues the line, leading space included
                else:
                    text = text.strip()
                    full = layout.max_line_count is not None and (
                        long_pause or line_count >= layout.max_line_count
                    )
                    if chunk_break or (len(subtitle) > 0 and full):
                        yield subtitle
                        subtitle = []
                        line_count = 1
                    elif line_len > 0:
                        line_count += 1
                        text = "\n" + text
                    line_len = len(text.strip())
                    timing["word"] = text
                subtitle.append(timing)
                previous_start = timing["start"]
    if subtitle:
        yield subtitle


#: everything after the leading whitespace goes inside <u>...</u>; like the reference, a word whose
#: text has an inner newline is left as it is ("." does not match "\n")
_HIGHLIGHT = re.compile(r"^(\s*)(.*)$")


def _underline(word: str) -> str:
    return _HIGHLIGHT.sub(r"\1<u>\2</u>", word)


def _cues(result: dict, options: Options | None, hours: bool, marker: str) -> Iterator[tuple[str, str, str]]:
    """(start, end, text) for each cue, timestamps already formatted."""
    layout = _SubtitleLayout.from_options(options)
    segments = result["segments"]

    def stamp(seconds: float) -> str:
        return format_timestamp(seconds, always_include_hours=hours, decimal_marker=marker)

    # word timings are used only when every segment has them (the reference looks at the first segment
    # only, and then fails on a later one without "words")
    if not segments or not all("words" in segment for segment in segments):
        for segment in segments:
            # "-->" would end the cue's timing line early in a player
            yield stamp(segment["start"]), stamp(segment["end"]), segment["text"].strip().replace("-->", "->")
        return

    for subtitle in _group_words(segments, layout):
        text = "".join(timing["word"] for timing in subtitle)
        first = stamp(subtitle[0]["start"])
        if not layout.highlight_words:
            yield first, stamp(subtitle[-1]["end"]), text
            continue
        # one cue per word with that word underlined, plus an un-highlighted cue filling any gap before
        # a word; gaps are detected on the formatted timestamps, as the reference does
        cursor = first
        for index, timing in enumerate(subtitle):
            start, end = stamp(timing["start"]), stamp(timing["end"])
            if cursor != start:
                yield cursor, start, text
            yield (
                start,
                end,
                "".join(_underline(w["word"]) if j == index else w["word"] for j, w in enumerate(subtitle)),
            )
            cursor = end


# ---------------------------------------------------------------------------------------------------
# renderers: result -> the file's full text


def _render_txt(result: dict, options: Options | None = None) -> str:
    return "".join(segment["text"].strip() + "\n" for segment in result["segments"])


def _render_vtt(result: dict, options: Options | None = None) -> str:
    cues = (f"{start} --> {end}\n{text}\n\n" for start, end, text in _cues(result, options, False, "."))
    return "WEBVTT\n\n" + "".join(cues)


def _render_srt(result: dict, options: Options | None = None) -> str:
    cues = _cues(result, options, True, ",")
    return "".join(
        f"{n}\n{start} --> {end}\n{text}\n\n" for n, (start, end, text) in enumerate(cues, start=1)
    )


def _render_tsv(result: dict, options: Options | None = None) -> str:
    # integer milliseconds: immune to locales that write the decimal point as a comma
    lines = ["start\tend\ttext\n"]
    for segment in result["segments"]:
        start = round(1000 * float(segment["start"]))
        end = round(1000 * float(segment["end"]))
        text = segment["text"].strip().replace("\t", " ")  # a tab would add a column
        lines.append(f"{start}\t{end}\t{text}\n")
    return "".join(lines)


def _json_fallback(value: Any) -> Any:
    """Make tensors and numpy arrays/scalars serialisable; anything else is still an error."""
    if hasattr(value, "tolist"):  # torch.Tensor, numpy.ndarray and numpy scalars (0-d -> Python scalar)
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _render_json(result: dict, options: Options | None = None) -> str:
    # json.dump's defaults (ensure_ascii=True, ", " and ": " separators, NaN allowed) as the reference
    return json.dumps(result, default=_json_fallback)


_RENDERERS: dict[str, Callable[[dict, Options | None], str]] = {
    "txt": _render_txt,
    "vtt": _render_vtt,
    "srt": _render_srt,
    "tsv": _render_tsv,
    "json": _render_json,
}


def _check_format(output_format: str) -> None:
    if output_format != "all" and output_format not in _RENDERERS:
        valid = ", ".join((*SUPPORTED_FORMATS, "all"))
        raise ValueError(f"unknown output format {output_format!r}; valid formats: {valid}")


def render(result: dict, output_format: str, options: Options | None = None) -> str:
    """The full text of one output file, without writing it (for tests, stdout, or other sinks)."""
    _check_format(output_format)
    if output_format == "all":
        raise ValueError("render() produces one format; 'all' is only for get_writer()")
    return _RENDERERS[output_format](result, options)


# ---------------------------------------------------------------------------------------------------
# writing


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` as UTF-8 to ``path`` so that readers see the old file or the new one, never half.

    The temporary file lives in the destination directory so ``os.replace`` is a same-filesystem rename;
    it is created with mode 0o666 (minus the umask) like a plain ``open``, and removed on any failure.
    """
    data = text.encode("utf-8")  # an encoding error must not even create the temporary file
    directory, name = os.path.split(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    while True:
        temporary = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:  # pragma: no cover - a 48-bit name collision
            continue
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def _output_path(output_dir: str, audio_path: str, extension: str) -> str:
    stem = os.path.splitext(os.path.basename(audio_path))[0]
    if not stem:
        raise ValueError(f"cannot name an output file after audio path {audio_path!r}")
    return os.path.join(output_dir, f"{stem}.{extension}")


def get_writer(output_format: str, output_dir: str) -> Writer:
    """``write(result, audio_path, options)`` writing ``<output_dir>/<audio stem>.<format>``.

    ``"all"`` writes every supported format; all of them are rendered before any is written, so a
    result that cannot be rendered (say, an unserialisable JSON value) writes nothing at all.
    """
    _check_format(output_format)
    formats = SUPPORTED_FORMATS if output_format == "all" else (output_format,)

    def write(result: dict, audio_path: str, options: Options | None = None) -> None:
        texts = [(fmt, _RENDERERS[fmt](result, options)) for fmt in formats]
        for fmt, text in texts:
            write_atomic(_output_path(output_dir, audio_path, fmt), text)

    return write
