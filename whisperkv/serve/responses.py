"""A transcription result in the response format a request asked for, and the Server-Sent Events stream.

``json`` is ``{"text"}``; ``verbose_json`` adds task, language, duration and the segments with
openai-whisper's fields (and ``words`` when they were asked for); ``text``, ``srt`` and ``vtt`` are
rendered by ``whisperkv.writers``, the same text the CLI writes to files.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import PlainTextResponse, Response

from whisperkv.serve.request import AudioRequest
from whisperkv.tokenizer import LANGUAGES
from whisperkv.writers import render

SEGMENT_FIELDS = (
    "id",
    "seek",
    "start",
    "end",
    "text",
    "tokens",
    "temperature",
    "avg_logprob",
    "compression_ratio",
    "no_speech_prob",
)


def _to_json(value: Any) -> Any:
    if hasattr(value, "tolist"):  # tensors and numpy scalars the engine may leave in a result
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class JSONBody(Response):
    """JSON like ``json.dumps``'s defaults (NaN allowed, as openai-whisper writes it)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, default=_to_json).encode("utf-8")


def _segment(segment: dict, with_words: bool) -> dict:
    out = {name: segment[name] for name in SEGMENT_FIELDS}
    if with_words:
        out["words"] = segment.get("words", [])
    return out


def verbose_json(result: dict, request: AudioRequest, duration: float) -> dict:
    """OpenAI's verbose_json: segments unless only words were asked for; top-level words when asked."""
    body: dict[str, Any] = {
        "task": request.options.get("task", "transcribe"),
        "language": LANGUAGES.get(result["language"], result["language"]),
        "duration": duration,
        "text": result["text"],
    }
    if not request.granularities or "segment" in request.granularities:
        body["segments"] = [_segment(s, request.wants_words) for s in result["segments"]]
    if request.wants_words:
        body["words"] = [
            {"word": w["word"], "start": w["start"], "end": w["end"]}
            for s in result["segments"]
            for w in s.get("words", [])
        ]
    return body


def format_result(result: dict, request: AudioRequest, duration: float) -> Response:
    fmt = request.response_format
    if fmt == "json":
        return JSONBody({"text": result["text"]})
    if fmt == "verbose_json":
        return JSONBody(verbose_json(result, request, duration))
    if fmt == "text":
        return PlainTextResponse(result["text"] + "\n")
    text = render(result, fmt)  # srt or vtt, as the CLI writes them
    return PlainTextResponse(text, media_type="text/vtt" if fmt == "vtt" else "application/x-subrip")


def sse_event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload, ensure_ascii=False, default=_to_json)}\n\n".encode()


def delta_event(segment: dict) -> bytes:
    return sse_event({"type": "transcript.text.delta", "delta": segment["text"]})


def done_event(result: dict) -> bytes:
    return sse_event({"type": "transcript.text.done", "text": result["text"]})


def error_event(body: dict) -> bytes:
    """An error after the stream started (the status line is already sent): OpenAI's error event."""
    return sse_event({"type": "error", **body})
