"""OpenAI's Realtime transcription session over a WebSocket: ``/v1/realtime?intent=transcription``.

Client events: ``session.update`` (``session.type`` = ``transcription``; input ``audio/pcm`` at 24 kHz,
or 16 kHz; ``turn_detection`` ``server_vad`` (default) or null, then the client's commits end
utterances; whisperkv's own ``transcription.confident``: ``whisperkv stream --confident``'s
probability, or null), ``input_audio_buffer.append`` (base64 PCM16), ``input_audio_buffer.commit``,
``input_audio_buffer.clear``. Server events: ``session.created`` / ``session.updated``,
``input_audio_buffer.speech_started`` / ``speech_stopped`` (silero VAD), ``input_audio_buffer.committed``,
``input_audio_buffer.cleared``, ``conversation.item.input_audio_transcription.delta`` (text newly committed
by LocalAgreement-2) and ``.completed`` (per utterance), and ``error`` for a bad event or frame — after
which the session goes on.

A client is hostile until proved otherwise. Before the handshake it is admitted or refused with an HTTP
error (``realtime_admission``: the key, the server's state, the intent, the session cap). Each message is
parsed and checked whole (``realtime_events``) before the session acts on it; an append that would take
the uncommitted audio past ``realtime_buffer_s`` seconds is an error event, and so is a message longer
than an append of ``MAX_APPEND_S`` seconds. A client that disconnects cancels the decode in flight.

Each connection owns one ``StreamingSession``. Its decodes go to the server's ``Scheduler`` when the app
has one (``app.state.scheduler``): each update is an ``UpdateJob`` on the ≤ 30 s buffer with the committed
text as its prompt, batched with every other request, and the session keeps its store and reuse ledger
across updates (``realtime_decoder``), so it takes the exact reuse ``whisperkv stream`` takes. Each
``.completed`` event carries the session's ``reuse`` counts so far, and ``/metrics`` sums them over
sessions. Without a scheduler the session decodes in this process with ``LocalDecoder``. Decoding runs in
a worker thread; audio that arrives meanwhile waits in the socket (past ``INBOX_EVENTS`` read ahead), as
on the computation-aware clock.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import uuid
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from uvicorn.protocols.utils import ClientDisconnected

from whisperkv.audio import SAMPLE_RATE
from whisperkv.errors import WhisperKVError
from whisperkv.serve.realtime_admission import deny, refusal, sessions_full
from whisperkv.serve.realtime_decoder import SchedulerDecoder
from whisperkv.serve.realtime_events import (
    LANGUAGE_PARAM,
    ClientEvent,
    RealtimeError,
    SessionUpdate,
    parse_event,
    quote,
)
from whisperkv.serve.settings import ServeSettings
from whisperkv.stream.events import Event
from whisperkv.stream.pcm import PCMError, Resampler
from whisperkv.stream.session import StreamingSession
from whisperkv.stream.vad import SpeechDetector

router = APIRouter()

CHUNK_S = 1.0  # seconds of new audio between updates
#: messages read ahead of the one being handled (few: each may be a whole buffer's worth)
INBOX_EVENTS = 1
#: room for the JSON around an append's base64 audio in the message cap (characters)
MESSAGE_OVERHEAD_CHARS = 64 * 1024
#: the most audio one append may carry (seconds; less when the buffer cap is lower): each message is
#: held a few times over while it is parsed, decoded and resampled, by every session at once
MAX_APPEND_S = 15.0


class TranscriptionConnection:
    """One client: its session configuration, its stream, and the items (utterances) it produced."""

    def __init__(self, websocket: WebSocket) -> None:
        self.ws = websocket
        settings = getattr(websocket.app.state, "settings", None) or ServeSettings()
        self.max_message = max_message_chars(settings.realtime_buffer_s)
        self.buffer_s = settings.realtime_buffer_s
        self.id = f"sess_{uuid.uuid4().hex[:16]}"
        self.rate = 24000
        self.language: str | None = None
        self.prompt = ""
        self.server_vad = True
        self.confident: float | None = None
        self.items = itertools.count(1)
        self.item_id: str | None = None
        self.previous_item_id: str | None = None
        self.item_has_text = False
        self.pending = 0  # samples fed since the last update
        self.resampler = Resampler(self.rate)
        self.stream = self._new_stream()
        self.reuse_counted: dict | None = None  # the stream's reuse counts already added to /metrics
        self.gone = asyncio.Event()  # the client disconnected

    def _new_stream(self) -> StreamingSession:
        """A stream whose provenance names this session; its updates run on the server's scheduler (in
        this process without one). A multilingual model given no language detects it once."""
        app = self.ws.app
        model, scheduler = app.state.model, getattr(app.state, "scheduler", None)
        language = self.language or ("en" if not model.is_multilingual else None)
        if scheduler is not None:
            decoder: Any = SchedulerDecoder(scheduler, model, language, self.id)
        else:
            from whisperkv.stream.local_decoder import LocalDecoder

            decoder = LocalDecoder(model, language, request_id=self.id)
        vad = SpeechDetector() if self.server_vad else None
        return StreamingSession(decoder, vad=vad, confident=self.confident)

    def description(self) -> dict:
        return {
            "object": "realtime.session",
            "type": "transcription",
            "id": self.id,
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": self.rate},
                    "transcription": {
                        "model": "whisper-1",
                        "language": self.language,
                        "prompt": self.prompt,
                        "confident": self.confident,
                    },
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
        """Answer the client's events in order until it disconnects; a disconnect cancels the decode in
        flight (its scheduler job leaves the batch at the next step)."""
        await self.send("session.created", session=self.description())
        inbox: asyncio.Queue = asyncio.Queue(maxsize=INBOX_EVENTS)
        reader = asyncio.create_task(self._read(inbox))
        gone = asyncio.create_task(self.gone.wait())
        try:
            while not self.gone.is_set():
                message = await inbox.get()
                if message is None or self.gone.is_set():
                    return
                work = asyncio.create_task(self.answer(message))
                await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not work.done():  # the client left mid-decode
                    work.cancel()
                    return
                work.result()
        finally:
            self.cancel_decoding()
            reader.cancel()
            gone.cancel()

    async def _read(self, inbox: asyncio.Queue) -> None:
        """Read the socket while events are handled, so a disconnect is seen during a decode (at most
        ``INBOX_EVENTS`` wait: past that the socket is not read, and the client waits)."""
        try:
            while (message := await self.ws.receive())["type"] != "websocket.disconnect":
                await inbox.put(message)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass
        finally:
            self.gone.set()
        await inbox.put(None)

    def cancel_decoding(self) -> None:
        cancel = getattr(self.stream.decoder, "cancel", None)
        if cancel is not None:
            cancel()

    async def answer(self, message: dict) -> None:
        """One message: its event handled, or an ``error`` event saying why not (the session goes on)."""
        event_id = None
        try:
            event = parse_event(message.get("text"), self.max_message)
            event_id = event.event_id
            await self.handle(event)
        except RealtimeError as err:
            await self.send_error(err, err.event_id or event_id)
        except WhisperKVError as err:  # the scheduler refused an update (queue full, shutting down)
            await self.send_error(
                RealtimeError("server_busy", f"this update was not decoded: {err}"), event_id
            )

    async def handle(self, event: ClientEvent) -> None:
        kind = event.type
        if kind == "session.update":
            assert event.session is not None
            stream = self.stream
            await asyncio.to_thread(self.configure, event.session)  # a new stream's VAD loads a model
            if self.stream is not stream:  # a new stream: warmed before its audio arrives (issue 42)
                await asyncio.to_thread(self.stream.warm)
            await self.send("session.updated", session=self.description())
        elif kind == "input_audio_buffer.append":
            await self.append(event.audio)
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
        else:  # input_audio_buffer.clear: parse_event lets through no other type
            await self.emit(self.stream.clear())  # an item that waited on words its close held ends
            self.item_id = None
            await self.send("input_audio_buffer.cleared")

    def held_seconds(self) -> float:
        """Seconds of audio the stream holds for the utterance not yet committed (silence between
        utterances is not held)."""
        stream = self.stream
        return (stream.received - stream.buffer_start) / SAMPLE_RATE if stream.in_speech else 0.0

    async def append(self, data: bytes) -> None:
        incoming = len(data) / 2 / self.rate
        if self.held_seconds() + incoming > self.buffer_s:
            raise RealtimeError(
                "input_audio_buffer_full",
                f"this append ({incoming:.1f} s) would take the input audio buffer past the server's "
                f"limit of {self.buffer_s:g} s (--realtime_buffer_s; {self.held_seconds():.1f} s held): "
                "commit or clear it, or send the audio in smaller pieces as it is spoken",
                "audio",
            )
        try:
            samples = self.resampler(data)
        except PCMError as err:
            raise RealtimeError("invalid_audio", f"'audio': {err}", "audio") from None
        if self.item_id is None and not self.server_vad:
            self.item_id = self.new_item()
        events = await asyncio.to_thread(self.stream.feed, samples)
        self.pending += len(samples)
        if self.pending >= CHUNK_S * SAMPLE_RATE:
            self.pending = 0
            events += await asyncio.to_thread(self.stream.update)
        await self.emit(events)

    def configure(self, update: SessionUpdate) -> None:
        """Apply a checked session update: all of it, or (a RealtimeError) none of it."""
        language = self.checked_language(update.language) if update.language_given else self.language
        rebuild = language != self.language
        if update.rate is not None and update.rate != self.rate:
            self.rate, self.resampler = update.rate, Resampler(update.rate)
        self.language = language
        self.prompt = update.prompt or self.prompt
        if update.server_vad is not None:
            rebuild = rebuild or update.server_vad != self.server_vad
            self.server_vad = update.server_vad
        if update.confident_given:  # the live stream's policy: no audio or agreement lost
            self.confident = self.stream.agreement.confident = update.confident
        if rebuild:  # a new stream: committed text so far stays committed (and was sent)
            self.stream, self.reuse_counted = self._new_stream(), None

    def checked_language(self, language: str | None) -> str | None:
        from whisperkv.tokenizer import LANGUAGES

        if language is not None and language not in LANGUAGES:
            raise RealtimeError("invalid_language", f"unknown language {quote(language)}", LANGUAGE_PARAM)
        if language not in (None, "en") and not self.ws.app.state.model.is_multilingual:
            raise RealtimeError(
                "invalid_language", f"the served model is English-only, not {quote(language)}", LANGUAGE_PARAM
            )
        return language

    def new_item(self) -> str:
        self.item_has_text = False
        return f"item_{self.id[5:13]}_{next(self.items)}"

    def count_reuse(self) -> dict:
        """The session's reuse counts so far (for its ``.completed`` event); ``/metrics`` adds what is new."""
        summary = self.stream.reuse_summary()
        metrics = getattr(self.ws.app.state, "metrics", None)
        if metrics is not None:
            metrics.count_stream_reuse(self.reuse_counted, summary)
        self.reuse_counted = summary
        return summary

    def now_ms(self) -> int:
        return int(self.stream.received * 1000 / SAMPLE_RATE)

    async def emit(self, events: list[Event]) -> None:
        """Session events as Realtime server events, in order."""
        for event in events:
            if event.type == "speech_started":
                if self.item_id is None:  # else opened by words heard in the pause before this speech
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
                if self.item_id is None:  # words heard in a pause the VAD passed over: they open an item
                    self.item_id = self.new_item()
                # the words as spelt, leading spaces and all: the deltas add up to the transcript, also
                # where a commit only ends the word before it ("13." after "in 18")
                delta = "".join(w.text for w in event.words) if self.item_has_text else event.text
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
                    reuse=self.count_reuse(),
                )
                self.previous_item_id, self.item_id = self.item_id, None


def max_message_chars(buffer_s: float) -> int:
    """The longest event a session reads: one append of ``MAX_APPEND_S`` (or the whole buffer, if less)
    at 24 kHz, in base64, plus room for the JSON around it."""
    seconds = min(buffer_s, MAX_APPEND_S)
    return 4 * math.ceil(seconds * 24000 * 2 / 3) + MESSAGE_OVERHEAD_CHARS


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket, intent: str | None = None) -> None:
    """Admit the client (key, state, intent, session cap) before the handshake, then run its session."""
    refused = refusal(websocket, intent)
    sessions = getattr(websocket.app.state, "realtime_sessions", None)
    if refused is None and sessions is not None and not sessions.try_open():
        refused = sessions_full(sessions.limit)
        sessions = None  # not opened: nothing to close
    if refused is not None:
        await deny(websocket, refused)
        return
    try:
        await websocket.accept()
        # made off the event loop: its voice detector loads a model
        connection = await asyncio.to_thread(TranscriptionConnection, websocket)
        await asyncio.to_thread(connection.stream.warm)  # the first update as fast as the later ones
        await connection.run()
    except (WebSocketDisconnect, ClientDisconnected):
        return
    finally:
        if sessions is not None:
            sessions.close()
