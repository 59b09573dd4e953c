"""OpenAI's Realtime transcription session over a WebSocket: ``/v1/realtime?intent=transcription``.

Client events: ``session.update`` (``session.type`` = ``transcription``; input ``audio/pcm`` at 24 kHz,
or 16 kHz; ``turn_detection`` ``server_vad`` (default) or null, then the client's commits end
utterances), ``input_audio_buffer.append`` (base64 PCM16), ``input_audio_buffer.commit``,
``input_audio_buffer.clear``. Server events: ``session.created`` / ``session.updated``,
``input_audio_buffer.speech_started`` / ``speech_stopped`` (silero VAD), ``input_audio_buffer.committed``,
``input_audio_buffer.cleared``, ``conversation.item.input_audio_transcription.delta`` (text newly committed
by LocalAgreement-2) and ``.completed`` (per utterance), and ``error`` for a bad event or frame — after
which the session goes on.

Each connection owns one ``StreamingSession``. Its decodes go to the server's ``Scheduler`` when the app
has one (``app.state.scheduler``): each update is a job on the ≤ 30 s buffer with the committed text as
``initial_prompt``, batched with every other request. Without a scheduler the session decodes in this
process with ``LocalDecoder``. Decoding runs in a worker thread; audio that arrives meanwhile waits in the
socket, as on the computation-aware clock.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import itertools
import json
import secrets
import uuid
from typing import Any

import numpy as np
from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from whisperkv.errors import WhisperKVError
from whisperkv.stream.events import Event
from whisperkv.stream.hypothesis import Hypothesis, hypothesis_from_segments
from whisperkv.stream.pcm import PCMError, Resampler
from whisperkv.stream.session import SAMPLE_RATE, StreamingSession
from whisperkv.stream.vad import SpeechDetector

router = APIRouter()

RATES = (24000, 16000)
CHUNK_S = 1.0  # seconds of new audio between updates


class SchedulerDecoder:
    """Updates decoded as jobs of the server's scheduler (no state carried between jobs)."""

    def __init__(self, scheduler: Any, language: str | None, stream_id: str) -> None:
        self.scheduler = scheduler
        self.language = language
        self.stream_id = stream_id
        self.jobs = itertools.count()
        self.updates = 0

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str) -> Hypothesis:
        self.updates += 1
        options = {"language": self.language, "initial_prompt": prompt or None, "word_timestamps": True}
        handle = self.scheduler.submit(audio, options, request_id=f"{self.stream_id}-{next(self.jobs)}")
        segments = handle.result()["segments"]
        return hypothesis_from_segments(segments, max(len(segments) - 1, 0))

    def reuse_summary(self) -> dict:
        zero = {"encoder_output": 0, "cross_kv": 0, "prompt_self_kv": 0}
        return {"type": "reuse", "attempted": zero, "accepted": zero, "refused": {}, "updates": self.updates}


class RealtimeError(ValueError):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.param = code, param


class TranscriptionConnection:
    """One client: its session configuration, its stream, and the items (utterances) it produced."""

    def __init__(self, websocket: WebSocket) -> None:
        self.ws = websocket
        self.id = f"sess_{uuid.uuid4().hex[:16]}"
        self.rate = 24000
        self.language: str | None = None
        self.prompt = ""
        self.server_vad = True
        self.items = itertools.count(1)
        self.item_id: str | None = None
        self.previous_item_id: str | None = None
        self.item_has_text = False
        self.pending = 0  # samples fed since the last update
        self.resampler = Resampler(self.rate)
        self.stream = self._new_stream()

    def _new_stream(self) -> StreamingSession:
        app = self.ws.app
        scheduler = getattr(app.state, "scheduler", None)
        if scheduler is not None:
            decoder: Any = SchedulerDecoder(scheduler, self.language, self.id)
        else:
            from whisperkv.stream.local_decoder import LocalDecoder

            model = app.state.model
            decoder = LocalDecoder(model, self.language or ("en" if not model.is_multilingual else None))
        return StreamingSession(decoder, vad=SpeechDetector() if self.server_vad else None)

    def description(self) -> dict:
        return {
            "object": "realtime.session",
            "type": "transcription",
            "id": self.id,
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": self.rate},
                    "transcription": {"model": "whisper-1", "language": self.language, "prompt": self.prompt},
                    "turn_detection": {"type": "server_vad"} if self.server_vad else None,
                }
            },
        }

    async def send(self, kind: str, **fields: Any) -> None:
        await self.ws.send_text(
            json.dumps({"event_id": f"event_{uuid.uuid4().hex[:16]}", "type": kind, **fields})
        )

    async def send_error(self, err: RealtimeError, event_id: str | None = None) -> None:
        error = {"type": "invalid_request_error", "code": err.code, "message": str(err), "param": err.param}
        await self.send("error", error={**error, "event_id": event_id})

    async def run(self) -> None:
        await self.send("session.created", session=self.description())
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            event_id = None
            try:
                if message.get("text") is None:
                    raise RealtimeError(
                        "invalid_frame", "binary frames are not accepted: send JSON text events"
                    )
                event = parse_event(message["text"])
                event_id = event.get("event_id")
                await self.handle(event)
            except RealtimeError as err:
                await self.send_error(err, event_id)
            except WhisperKVError as err:  # the scheduler refused an update (queue full, shutting down)
                await self.send_error(
                    RealtimeError("server_busy", f"this update was not decoded: {err}"), event_id
                )

    async def handle(self, event: dict) -> None:
        kind = event["type"]
        if kind == "session.update":
            self.configure(event.get("session"))
            await self.send("session.updated", session=self.description())
        elif kind == "input_audio_buffer.append":
            samples = self.decode_audio(event.get("audio"))
            if self.item_id is None and not self.server_vad:
                self.item_id = self.new_item()
            events = await asyncio.to_thread(self.stream.feed, samples)
            self.pending += len(samples)
            if self.pending >= CHUNK_S * SAMPLE_RATE:
                self.pending = 0
                events += await asyncio.to_thread(self.stream.update)
            await self.emit(events)
        elif kind == "input_audio_buffer.commit":
            if not self.stream.has_speech:
                raise RealtimeError(
                    "input_audio_buffer_commit_empty", "the input audio buffer holds no speech"
                )
            if self.server_vad:  # the VAD would have said so: a forced end of the utterance
                await self.send(
                    "input_audio_buffer.speech_stopped", audio_end_ms=self.now_ms(), item_id=self.item_id
                )
            await self.send(
                "input_audio_buffer.committed", item_id=self.item_id, previous_item_id=self.previous_item_id
            )
            await self.emit(await asyncio.to_thread(self.stream.commit))
        elif kind == "input_audio_buffer.clear":
            self.stream.clear()
            self.item_id = None
            await self.send("input_audio_buffer.cleared")
        else:
            raise RealtimeError("unknown_event_type", f"unknown event type {kind!r}", "type")

    def configure(self, session: Any) -> None:
        if not isinstance(session, dict):
            raise RealtimeError("invalid_session", "session.update needs a 'session' object", "session")
        if session.get("type", "transcription") != "transcription":
            raise RealtimeError(
                "invalid_session_type", "this endpoint serves transcription sessions only", "session.type"
            )
        audio = json_object(session.get("audio"), "session.audio")
        audio_input = json_object(audio.get("input"), "session.audio.input")
        fmt = audio_input.get("format")
        if fmt is not None:
            if not isinstance(fmt, dict) or fmt.get("type", "audio/pcm") != "audio/pcm":
                raise RealtimeError(
                    "invalid_format", "input format must be audio/pcm", "session.audio.input.format"
                )
            rate = fmt.get("rate", 24000)
            if rate not in RATES:
                raise RealtimeError(
                    "invalid_rate",
                    f"rate must be 24000 or 16000, got {rate!r}",
                    "session.audio.input.format.rate",
                )
            if rate != self.rate:
                self.rate, self.resampler = rate, Resampler(rate)
        transcription = json_object(audio_input.get("transcription"), "session.audio.input.transcription")
        rebuild = False
        if "language" in transcription and transcription["language"] != self.language:
            self.language, rebuild = self.checked_language(transcription["language"]), True
        self.prompt = transcription.get("prompt") or self.prompt
        if "turn_detection" in audio_input:
            vad = audio_input["turn_detection"] is not None
            rebuild = rebuild or vad != self.server_vad
            self.server_vad = vad
        if rebuild:  # a new stream: committed text so far stays committed (and was sent)
            self.stream = self._new_stream()

    def checked_language(self, language: Any) -> str | None:
        from whisperkv.tokenizer import LANGUAGES

        param = "session.audio.input.transcription.language"
        if language is not None and language not in LANGUAGES:
            raise RealtimeError("invalid_language", f"unknown language {language!r}", param)
        if language not in (None, "en") and not self.ws.app.state.model.is_multilingual:
            raise RealtimeError(
                "invalid_language", f"the served model is English-only, not {language!r}", param
            )
        return language

    def decode_audio(self, audio: Any) -> np.ndarray:
        if not isinstance(audio, str):
            raise RealtimeError("invalid_audio", "'audio' must be a base64 string", "audio")
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise RealtimeError("invalid_audio", "'audio' is not valid base64", "audio") from None
        try:
            return self.resampler(data)
        except PCMError as err:
            raise RealtimeError("invalid_audio", f"'audio': {err}", "audio") from None

    def new_item(self) -> str:
        self.item_has_text = False
        return f"item_{self.id[5:13]}_{next(self.items)}"

    def now_ms(self) -> int:
        return int(self.stream.received * 1000 / SAMPLE_RATE)

    async def emit(self, events: list[Event]) -> None:
        """Session events as Realtime server events, in order."""
        for event in events:
            if event.type == "speech_started":
                self.item_id = self.new_item()
                await self.send(
                    "input_audio_buffer.speech_started",
                    audio_start_ms=int(event.start * 1000),
                    item_id=self.item_id,
                )
            elif event.type == "speech_stopped":
                await self.send(
                    "input_audio_buffer.speech_stopped",
                    audio_end_ms=int(event.end * 1000),
                    item_id=self.item_id,
                )
                await self.send(
                    "input_audio_buffer.committed",
                    item_id=self.item_id,
                    previous_item_id=self.previous_item_id,
                )
            elif event.type == "commit":
                delta = " " + event.text if self.item_has_text else event.text
                self.item_has_text = True
                await self.send(
                    "conversation.item.input_audio_transcription.delta",
                    item_id=self.item_id,
                    content_index=0,
                    delta=delta,
                )
            elif event.type == "utterance_end":
                await self.send(
                    "conversation.item.input_audio_transcription.completed",
                    item_id=self.item_id,
                    content_index=0,
                    transcript=event.text,
                )
                self.previous_item_id, self.item_id = self.item_id, None


def json_object(value: Any, param: str) -> dict:
    """An optional JSON object field: absent or null is empty, anything else but an object is an error."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RealtimeError("invalid_value", f"'{param}' must be an object", param)
    return value


def parse_event(text: str) -> dict:
    try:
        event = json.loads(text)
    except json.JSONDecodeError as err:
        raise RealtimeError("invalid_json", f"not JSON: {err.msg}") from None
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise RealtimeError("invalid_event", "an event is a JSON object with a string 'type'", "type")
    return event


def refusal(websocket: WebSocket, intent: str | None) -> tuple[RealtimeError, int] | None:
    """Why this connection may not start (and the close code), or None: the key, the state, the intent."""
    settings = getattr(websocket.app.state, "settings", None)
    expected = getattr(settings, "api_key", None)
    if expected:
        scheme, _, given = websocket.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
            given.strip().encode(), expected.encode()
        ):
            return RealtimeError(
                "invalid_api_key", "missing or incorrect API key: send 'Authorization: Bearer KEY'"
            ), 1008
    lifecycle = getattr(websocket.app.state, "lifecycle", None)
    if lifecycle is not None and lifecycle.shutting_down:
        return RealtimeError("shutting_down", "the server is shutting down; retry on another instance"), 1013
    if intent != "transcription":
        return RealtimeError(
            "unsupported_intent", "only ?intent=transcription is served here", "intent"
        ), 1008
    return None


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket, intent: str | None = None) -> None:
    await websocket.accept()
    refused = refusal(websocket, intent)
    if refused is not None:
        error, code = refused
        payload = {
            "type": "invalid_request_error",
            "code": error.code,
            "message": str(error),
            "param": error.param,
        }
        await websocket.send_text(
            json.dumps({"event_id": f"event_{uuid.uuid4().hex[:16]}", "type": "error", "error": payload})
        )
        await websocket.close(code=code)
        return
    connection = TranscriptionConnection(websocket)
    try:
        await connection.run()
    except WebSocketDisconnect:
        return
