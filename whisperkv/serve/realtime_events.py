"""The Realtime client events, parsed and checked completely before a session acts on one.

A WebSocket message is hostile until proved otherwise: ``parse_event`` turns any text or bytes into a
:class:`ClientEvent` whose fields have their types (audio decoded from base64 to PCM16 bytes, the session
update's values checked) or raises :class:`RealtimeError` naming the field, and nothing else: not JSON,
nested too deeply for the parser, an unknown type, a list where a string belongs, bad base64, a message over
the size cap. The connection answers each such error with an ``error`` event and goes on.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

#: input sample rates a session may declare (OpenAI's 24 kHz, and Whisper's own 16 kHz)
RATES = (24000, 16000)
EVENT_TYPES = (
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
)
#: longest event_id echoed back in an error, and longest prompt kept (characters)
MAX_EVENT_ID_CHARS = 256
MAX_PROMPT_CHARS = 4096
#: how much of a client's value an error message quotes
QUOTE_CHARS = 64
LANGUAGE_PARAM = "session.audio.input.transcription.language"
CONFIDENT_PARAM = "session.audio.input.transcription.confident"


class RealtimeError(ValueError):
    """A client event the session cannot act on: ``code``, a message, the field at fault, its event_id."""

    def __init__(
        self, code: str, message: str, param: str | None = None, event_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.param, self.event_id = code, param, event_id


@dataclass(frozen=True)
class SessionUpdate:
    """What a ``session.update`` changes; None (``language_given`` False) leaves a value as it is."""

    rate: int | None = None
    language: str | None = None
    language_given: bool = False
    prompt: str | None = None
    server_vad: bool | None = None
    #: ``whisperkv stream --confident``'s probability (None: only two agreeing updates commit a word)
    confident: float | None = None
    confident_given: bool = False


@dataclass(frozen=True)
class ClientEvent:
    type: str
    event_id: str | None = None
    audio: bytes = b""  # input_audio_buffer.append: PCM16 little-endian, mono
    session: SessionUpdate | None = None


def quote(value: Any) -> str:
    """A short, safe rendering of a client's value for an error message (never a deep repr)."""
    if isinstance(value, str):
        return repr(value[:QUOTE_CHARS]) + ("..." if len(value) > QUOTE_CHARS else "")
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return repr(value)[:QUOTE_CHARS]
    return f"a JSON {'array' if isinstance(value, list) else 'object'}"


def parse_event(message: str | bytes | None, max_bytes: int) -> ClientEvent:
    """The event in one WebSocket message (text frames only, at most ``max_bytes`` characters)."""
    if not isinstance(message, str):
        raise RealtimeError("invalid_frame", "binary frames are not accepted: send JSON text events")
    if len(message) > max_bytes:
        raise RealtimeError(
            "message_too_large", f"the event is {len(message)} characters, over the limit of {max_bytes}"
        )
    try:
        event = json.loads(message)
    except json.JSONDecodeError as err:
        raise RealtimeError("invalid_json", f"not JSON: {err.msg} at character {err.pos}") from None
    except RecursionError:
        raise RealtimeError("invalid_json", "not JSON this server reads: nested too deeply") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise RealtimeError("invalid_event", "an event is a JSON object with a string 'type'", "type")
    event_id = event.get("event_id")
    if event_id is not None and not (isinstance(event_id, str) and len(event_id) <= MAX_EVENT_ID_CHARS):
        raise RealtimeError(
            "invalid_value",
            f"'event_id' must be a string of at most {MAX_EVENT_ID_CHARS} characters",
            "event_id",
        )
    kind = event["type"]
    try:
        if kind == "session.update":
            return ClientEvent(kind, event_id, session=session_update(event.get("session")))
        if kind == "input_audio_buffer.append":
            return ClientEvent(kind, event_id, audio=pcm_bytes(event.get("audio")))
        if kind in EVENT_TYPES:
            return ClientEvent(kind, event_id)
        raise RealtimeError("unknown_event_type", f"unknown event type {quote(kind)}", "type")
    except RealtimeError as err:
        err.event_id = event_id
        raise


def json_object(value: Any, param: str) -> dict:
    """An optional JSON object field: absent or null is empty, anything else but an object is an error."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RealtimeError("invalid_value", f"'{param}' must be an object, not {quote(value)}", param)
    return value


def pcm_bytes(audio: Any) -> bytes:
    """An append's ``audio``: base64 of 16-bit PCM (an even number of bytes)."""
    if not isinstance(audio, str):
        raise RealtimeError("invalid_audio", "'audio' must be a base64 string", "audio")
    try:
        data = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError("invalid_audio", "'audio' is not valid base64", "audio") from None
    if len(data) % 2:
        raise RealtimeError(
            "invalid_audio", f"'audio': odd number of bytes ({len(data)}): not 16-bit PCM", "audio"
        )
    return data


def session_update(session: Any) -> SessionUpdate:
    """A ``session.update``'s ``session`` object, every value it sets checked for type and range."""
    if not isinstance(session, dict):
        raise RealtimeError("invalid_session", "session.update needs a 'session' object", "session")
    if session.get("type", "transcription") != "transcription":
        raise RealtimeError(
            "invalid_session_type", "this endpoint serves transcription sessions only", "session.type"
        )
    audio = json_object(session.get("audio"), "session.audio")
    audio_input = json_object(audio.get("input"), "session.audio.input")
    transcription = json_object(audio_input.get("transcription"), "session.audio.input.transcription")
    language = transcription.get("language")
    if language is not None and not isinstance(language, str):
        raise RealtimeError(
            "invalid_language", f"'language' must be a string, not {quote(language)}", LANGUAGE_PARAM
        )
    prompt = transcription.get("prompt")
    if prompt is not None and not (isinstance(prompt, str) and len(prompt) <= MAX_PROMPT_CHARS):
        raise RealtimeError(
            "invalid_value",
            f"'prompt' must be a string of at most {MAX_PROMPT_CHARS} characters",
            "session.audio.input.transcription.prompt",
        )
    return SessionUpdate(
        rate=_rate(audio_input.get("format")),
        language=language,
        language_given="language" in transcription,
        prompt=prompt,
        server_vad=_server_vad(audio_input),
        confident=_confident(transcription.get("confident")),
        confident_given="confident" in transcription,
    )


def _confident(value: Any) -> float | None:
    """``transcription.confident`` (a whisperkv extension, ``whisperkv stream --confident``): a number
    above 0 and at most 1 commits a word the model gave that probability (it and its punctuation) at its
    first hearing; null turns it off. Python's JSON reader takes NaN and Infinity: refused with the rest."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise RealtimeError(
            "invalid_value",
            f"'confident' must be null or a number above 0 and at most 1, not {quote(value)}",
            CONFIDENT_PARAM,
        )
    return float(value)


def _rate(fmt: Any) -> int | None:
    param = "session.audio.input.format"
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type", "audio/pcm") != "audio/pcm":
        raise RealtimeError("invalid_format", "input format must be audio/pcm", param)
    rate = fmt.get("rate", 24000)
    if isinstance(rate, bool) or rate not in RATES:  # True == 1 is no rate; 16000.0 is 16000
        raise RealtimeError(
            "invalid_rate", f"rate must be 24000 or 16000, got {quote(rate)}", param + ".rate"
        )
    return int(rate)


def _server_vad(audio_input: dict) -> bool | None:
    """``turn_detection``: null turns the VAD off (the client commits), an object of type server_vad
    turns it on; absent leaves it as it is."""
    if "turn_detection" not in audio_input:
        return None
    value = audio_input["turn_detection"]
    if value is None:
        return False
    if not isinstance(value, dict) or value.get("type", "server_vad") != "server_vad":
        raise RealtimeError(
            "invalid_turn_detection",
            "turn_detection must be null or {'type': 'server_vad'}",
            "session.audio.input.turn_detection",
        )
    return True
