"""Tests for whisperkv.writers: exact txt/vtt/srt/tsv/json formats, subtitle line splitting, atomic writes.

Expected outputs are written out literally, computed by hand from the format rules; the ``oracle`` tests
additionally compare byte-for-byte with openai-whisper's writers on the same hand-made results.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch

from tests.conftest import require_oracle
from whisperkv import writers
from whisperkv.writers import SUPPORTED_FORMATS, format_timestamp, get_writer, render

# --------------------------------------------------------------------------------------------------
# format_timestamp


@pytest.mark.parametrize(
    ("seconds", "short", "with_hours", "comma"),
    [
        (0, "00:00.000", "00:00:00.000", "00:00,000"),
        (1.5, "00:01.500", "00:00:01.500", "00:01,500"),
        # 61004.9 ms rounds up to 61005
        (61.0049, "01:01.005", "00:01:01.005", "01:01,005"),
        # 3599999.6 ms rounds up to a whole hour: the hours field appears even when not asked for
        (3599.9996, "01:00:00.000", "01:00:00.000", "01:00:00,000"),
        (3661.5, "01:01:01.500", "01:01:01.500", "01:01:01,500"),
    ],
)
def test_format_timestamp(seconds: float, short: str, with_hours: str, comma: str) -> None:
    assert format_timestamp(seconds) == short
    assert format_timestamp(seconds, always_include_hours=True) == with_hours
    assert format_timestamp(seconds, decimal_marker=",") == comma


def test_format_timestamp_rounds_half_to_even_and_accepts_tensors() -> None:
    assert format_timestamp(0.0025) == "00:00.002"  # 2.5 ms -> 2, Python's round()
    assert format_timestamp(np.float32(1.5)) == "00:01.500"
    assert format_timestamp(torch.tensor(1.5)) == "00:01.500"
    with pytest.raises(ValueError, match="non-negative"):
        format_timestamp(-0.5)
    with pytest.raises(ValueError, match="non-negative"):
        format_timestamp(float("nan"))


# --------------------------------------------------------------------------------------------------
# whole-file formats, segment level


def basic_result() -> dict:
    """Three segments: a tab, "-->", non-ASCII text, a >1 h timestamp and the engine's extra keys."""
    return {
        "text": " Hello world. It's\tcafé --> ok. Bye.",
        "segments": [
            {"id": 0, "start": 0.0, "end": 2.5, "text": " Hello world.", "tokens": [1, 2]},
            {"id": 1, "start": 2.5, "end": 61.0049, "text": " It's\tcafé --> ok. ", "tokens": [3]},
            {"id": 2, "start": 3599.9996, "end": 3661.5, "text": " Bye.", "tokens": []},
        ],
        "language": "fr",
        "language_probs": {"fr": 0.75, "en": 0.25},
        "cache": {"self_kv_bytes": 1024, "reuse": {"hits": ["window re-encoded"], "misses": 1}},
    }


EXPECTED = {
    "txt": "Hello world.\nIt's\tcafé --> ok.\nBye.\n",
    "vtt": (
        "WEBVTT\n\n"
        "00:00.000 --> 00:02.500\nHello world.\n\n"
        "00:02.500 --> 01:01.005\nIt's\tcafé -> ok.\n\n"
        "01:00:00.000 --> 01:01:01.500\nBye.\n\n"
    ),
    "srt": (
        "1\n00:00:00,000 --> 00:00:02,500\nHello world.\n\n"
        "2\n00:00:02,500 --> 00:01:01,005\nIt's\tcafé -> ok.\n\n"
        "3\n01:00:00,000 --> 01:01:01,500\nBye.\n\n"
    ),
    "tsv": (
        "start\tend\ttext\n0\t2500\tHello world.\n2500\t61005\tIt's café --> ok.\n3600000\t3661500\tBye.\n"
    ),
    "json": (
        '{"text": " Hello world. It\'s\\tcaf\\u00e9 --> ok. Bye.", "segments": ['
        '{"id": 0, "start": 0.0, "end": 2.5, "text": " Hello world.", "tokens": [1, 2]}, '
        '{"id": 1, "start": 2.5, "end": 61.0049, "text": " It\'s\\tcaf\\u00e9 --> ok. ", "tokens": [3]}, '
        '{"id": 2, "start": 3599.9996, "end": 3661.5, "text": " Bye.", "tokens": []}], '
        '"language": "fr", "language_probs": {"fr": 0.75, "en": 0.25}, '
        '"cache": {"self_kv_bytes": 1024, "reuse": {"hits": ["window re-encoded"], "misses": 1}}}'
    ),
}


@pytest.mark.parametrize("fmt", SUPPORTED_FORMATS)
def test_writer_exact_output(tmp_path, fmt: str) -> None:
    result = basic_result()
    get_writer(fmt, str(tmp_path))(result, "/some/where/talk.final.wav", {})
    assert os.listdir(tmp_path) == [f"talk.final.{fmt}"]
    written = (tmp_path / f"talk.final.{fmt}").read_bytes()
    assert written == EXPECTED[fmt].encode("utf-8")
    assert render(result, fmt) == EXPECTED[fmt]
    assert result == basic_result()  # the writers never modify the result


def test_empty_result() -> None:
    empty = {"text": "", "segments": [], "language": "en"}
    assert render(empty, "txt") == ""
    assert render(empty, "vtt") == "WEBVTT\n\n"
    assert render(empty, "srt") == ""
    assert render(empty, "tsv") == "start\tend\ttext\n"


def test_json_converts_tensors_and_numpy_values() -> None:
    result = {
        "text": "",
        "segments": [],
        "language": "en",
        "language_probs": {"en": np.float32(0.5), "de": torch.tensor(0.25)},
        "cache": {
            "shape": torch.tensor([1, 2]),
            "grid": np.array([[1.5]]),
            "n": np.int64(3),
            "ok": np.bool_(True),
        },
    }
    assert json.loads(render(result, "json")) == {
        "text": "",
        "segments": [],
        "language": "en",
        "language_probs": {"en": 0.5, "de": 0.25},
        "cache": {"shape": [1, 2], "grid": [[1.5]], "n": 3, "ok": True},
    }


# --------------------------------------------------------------------------------------------------
# word-level subtitles and line splitting


def word(text: str, start: float, end: float) -> dict:
    return {"word": text, "start": start, "end": end, "probability": 0.9}


def fox_result() -> dict:
    """Two segments; a 0.1 s gap before "fox" and a 3.8 s gap between the starts of "jumps" and "over"."""
    first = [
        word(" The", 0.0, 0.3),
        word(" quick", 0.3, 0.6),
        word(" brown", 0.6, 0.9),
        word(" fox", 1.0, 1.2),
    ]
    second = [word(" jumps", 1.2, 1.5), word(" over", 5.0, 5.3)]
    return {
        "text": " The quick brown fox jumps over",
        "segments": [
            {"id": 0, "start": 0.0, "end": 1.2, "text": " The quick brown fox", "words": first},
            {"id": 1, "start": 1.2, "end": 5.3, "text": " jumps over", "words": second},
        ],
        "language": "en",
    }


def test_line_splitting_one_line_highlighted() -> None:
    # width 20 and count 1 re-flow words across segments (max_words_per_line then has no effect):
    # "The quick brown fox" is 19 characters, " jumps" would make 25 -> new subtitle (one line only);
    # "over" starts 3.8 s after "jumps" started -> a long pause -> new subtitle.
    options = {"max_line_width": 20, "max_line_count": 1, "max_words_per_line": 3, "highlight_words": True}
    assert render(fox_result(), "vtt", options) == (
        "WEBVTT\n\n"
        "00:00.000 --> 00:00.300\n<u>The</u> quick brown fox\n\n"
        "00:00.300 --> 00:00.600\nThe <u>quick</u> brown fox\n\n"
        "00:00.600 --> 00:00.900\nThe quick <u>brown</u> fox\n\n"
        "00:00.900 --> 00:01.000\nThe quick brown fox\n\n"  # the gap before "fox", nothing underlined
        "00:01.000 --> 00:01.200\nThe quick brown <u>fox</u>\n\n"
        "00:01.200 --> 00:01.500\n<u>jumps</u>\n\n"
        "00:05.000 --> 00:05.300\n<u>over</u>\n\n"
    )


def test_line_splitting_two_lines() -> None:
    options = {"max_line_width": 20, "max_line_count": 2}
    assert render(fox_result(), "srt", options) == (
        "1\n00:00:00,000 --> 00:00:01,500\nThe quick brown fox\njumps\n\n"
        "2\n00:00:05,000 --> 00:00:05,300\nover\n\n"
    )


def test_max_words_per_line_alone_chunks_each_segment() -> None:
    # without both width and count, segments are kept and each chunk of 3 words is its own subtitle
    assert render(fox_result(), "vtt", {"max_words_per_line": 3}) == (
        "WEBVTT\n\n"
        "00:00.000 --> 00:00.900\nThe quick brown\n\n"
        "00:01.000 --> 00:01.200\nfox\n\n"
        "00:01.200 --> 00:05.300\njumps over\n\n"
    )


def test_words_without_options_keep_segments() -> None:
    assert render(fox_result(), "srt") == (
        "1\n00:00:00,000 --> 00:00:01,200\nThe quick brown fox\n\n"
        "2\n00:00:01,200 --> 00:00:05,300\njumps over\n\n"
    )


def test_negative_max_words_per_line_is_refused() -> None:
    with pytest.raises(ValueError, match="max_words_per_line"):
        render(fox_result(), "srt", {"max_words_per_line": -1})


def oracle_result() -> dict:
    """Several segments, punctuation, non-ASCII, a >3 s pause, a zero-word segment, a >1 h timestamp."""
    seg0 = [word(" Well,", 0.0, 0.4), word(" this", 0.5, 0.7), word(" is", 0.7, 0.8), word(" a", 0.8, 0.85)]
    seg0 += [word(" test.", 0.9, 1.3), word(" Isn't", 1.4, 1.7), word(" it?", 1.7, 2.0)]
    seg1 = [word(" Après", 5.5, 5.9), word(" la", 5.9, 6.0), word(" pause—", 6.0, 6.6)]
    seg1 += [word(" supercalifragilistic", 6.7, 7.9), word(" words!", 7.9, 8.4)]
    seg2: list[dict] = []
    seg3 = [word(" One", 3599.8, 3600.1), word(" hour", 3600.1, 3600.4), word(" in.", 3600.4, 3600.9)]
    segments = []
    for i, words in enumerate([seg0, seg1, seg2, seg3]):
        start, end = (words[0]["start"], words[-1]["end"]) if words else (8.4, 8.4)
        text = "".join(w["word"] for w in words)
        segments.append({"id": i, "seek": 0, "start": start, "end": end, "text": text, "words": words})
    return {"text": "".join(s["text"] for s in segments), "segments": segments, "language": "en"}


ORACLE_OPTIONS = [
    {},
    {"highlight_words": True},
    {"max_line_width": 16, "max_line_count": 2},
    {"max_line_width": 20, "max_line_count": 1, "highlight_words": True},
    {"max_line_width": 12, "max_line_count": 3, "max_words_per_line": 2},
    {"max_line_width": 10},
    {"max_line_count": 1},
    {"max_words_per_line": 2, "highlight_words": True},
    {"max_line_width": None, "max_line_count": None, "highlight_words": False, "max_words_per_line": None},
]


@pytest.mark.oracle
@pytest.mark.parametrize("options", ORACLE_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_subtitles_match_reference(tmp_path, fmt: str, options: dict) -> None:
    whisper_utils = require_oracle("whisper.utils")
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    theirs.mkdir()
    get_writer(fmt, str(ours))(oracle_result(), "a.wav", dict(options))
    whisper_utils.get_writer(fmt, str(theirs))(oracle_result(), "a.wav", dict(options))
    assert (ours / f"a.{fmt}").read_bytes() == (theirs / f"a.{fmt}").read_bytes()


@pytest.mark.oracle
@pytest.mark.parametrize("fmt", SUPPORTED_FORMATS)
def test_segment_formats_match_reference(tmp_path, fmt: str) -> None:
    whisper_utils = require_oracle("whisper.utils")
    for name, result in [("basic", basic_result()), ("words", oracle_result())]:
        ours, theirs = tmp_path / name / "ours", tmp_path / name / "theirs"
        theirs.mkdir(parents=True)
        get_writer(fmt, str(ours))(result, "a.wav", {})
        whisper_utils.get_writer(fmt, str(theirs))(result, "a.wav", {})
        assert (ours / f"a.{fmt}").read_bytes() == (theirs / f"a.{fmt}").read_bytes(), name


# --------------------------------------------------------------------------------------------------
# atomic writes


def test_unserialisable_json_leaves_nothing(tmp_path) -> None:
    old = tmp_path / "a.json"
    old.write_text("older output")
    result = basic_result()
    result["cache"]["unserialisable"] = object()
    with pytest.raises(TypeError, match="not JSON serializable"):
        get_writer("json", str(tmp_path))(result, "a.wav", {})
    assert os.listdir(tmp_path) == ["a.json"]
    assert old.read_text() == "older output"


def test_failure_after_partial_write_removes_temp_file(tmp_path, monkeypatch) -> None:
    old = tmp_path / "a.json"
    old.write_text("older output")
    seen: list[list[str]] = []

    def failing_fsync(fd: int) -> None:
        seen.append(sorted(os.listdir(tmp_path)))  # the temporary file exists, its data written
        raise OSError("disk full")

    monkeypatch.setattr(writers.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        get_writer("json", str(tmp_path))(basic_result(), "a.wav", {})
    assert len(seen) == 1 and len(seen[0]) == 2 and seen[0][0].endswith(".tmp")
    assert os.listdir(tmp_path) == ["a.json"]
    assert old.read_text() == "older output"

    monkeypatch.undo()
    fresh = tmp_path / "fresh"

    def failing_replace(src: str, dst: str) -> None:
        raise OSError("replace failed")

    monkeypatch.setattr(writers.os, "replace", failing_replace)
    with pytest.raises(OSError, match="replace failed"):
        get_writer("txt", str(fresh))(basic_result(), "a.wav", {})
    assert os.listdir(fresh) == []


def test_successful_write_replaces_old_file_with_umask_permissions(tmp_path) -> None:
    old = tmp_path / "a.txt"
    old.write_text("older output")
    previous = os.umask(0o022)
    try:
        get_writer("txt", str(tmp_path))(basic_result(), "a.wav", None)
    finally:
        os.umask(previous)
    assert os.listdir(tmp_path) == ["a.txt"]
    assert old.read_text(encoding="utf-8") == EXPECTED["txt"]
    assert os.stat(old).st_mode & 0o777 == 0o644


# --------------------------------------------------------------------------------------------------
# get_writer


def test_all_writes_five_files(tmp_path) -> None:
    out = tmp_path / "new" / "dir"  # created on demand
    get_writer("all", str(out))(basic_result(), "clip.mp3", {})
    assert sorted(os.listdir(out)) == sorted(f"clip.{fmt}" for fmt in SUPPORTED_FORMATS)
    for fmt in SUPPORTED_FORMATS:
        assert (out / f"clip.{fmt}").read_text(encoding="utf-8") == EXPECTED[fmt]


def test_all_renders_everything_before_writing(tmp_path) -> None:
    result = copy.deepcopy(basic_result())
    result["unserialisable"] = {1, 2}
    with pytest.raises(TypeError):
        get_writer("all", str(tmp_path))(result, "clip.mp3", {})
    assert os.listdir(tmp_path) == []


def test_unknown_format(tmp_path) -> None:
    with pytest.raises(ValueError, match="'docx'.*txt, vtt, srt, tsv, json, all"):
        get_writer("docx", str(tmp_path))
    with pytest.raises(ValueError):
        render(basic_result(), "all")
    assert os.listdir(tmp_path) == []
