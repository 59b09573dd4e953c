"""The same words from every path (issue 42): ``transcribe()``, ``whisperkv stream`` with and without a
VAD, and the Realtime WebSocket with server VAD and with the client's commit, all on jfk.

Compared on normalised words (Whisper's English normaliser): the paths decode different buffers —
``transcribe()`` one 30 s window, the stream a growing buffer with the committed text as its prompt, the
VAD path one utterance at a time, the server through its scheduler's jobs — so punctuation and case
differ (an utterance decoded alone ends in "!" where the whole clip has a comma), but the words must
not. The server tests start their own server on 127.0.0.1 and feed the audio as fast as it is taken.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time

import numpy as np
import pytest

from tests.conftest import require_oracle
from whisperkv.audio import load_audio
from whisperkv.metrics import normalize_text
from whisperkv.stream.clock import SimulatedClock
from whisperkv.stream.local_decoder import LocalDecoder
from whisperkv.stream.runner import run_stream
from whisperkv.stream.session import StreamingSession
from whisperkv.stream.sources import FileSamples
from whisperkv.stream.vad import SpeechDetector
from whisperkv.transcribe import transcribe

JFK = "en/jfk.flac"
API_KEY = "paths-test-key"
EVENT_TIMEOUT = 300  # seconds for any one server event (a loaded 2-core machine)
COMPLETED = "conversation.item.input_audio_transcription.completed"

pytestmark = pytest.mark.slow  # four real decodings of jfk, two through a server


@pytest.fixture(scope="module")
def offline(tiny_model, speech_dir) -> str:
    return transcribe(tiny_model, str(speech_dir / JFK), language="en")["text"]


@pytest.mark.parametrize("vad", [False, True], ids=["no_vad", "vad"])
def test_cli_stream_has_the_words_of_transcribe(tiny_model, speech_dir, offline, vad):
    session = StreamingSession(LocalDecoder(tiny_model), vad=SpeechDetector() if vad else None)
    list(run_stream(FileSamples(speech_dir / JFK), session, SimulatedClock(0.5), chunk=1.0))
    assert normalize_text(session.committed_text()) == normalize_text(offline)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_model):
    uvicorn = require_oracle("uvicorn")
    from whisperkv.engine import Scheduler
    from whisperkv.serve import ServeSettings, create_app

    app = create_app(tiny_model, Scheduler(tiny_model), ServeSettings(model_name="tiny.en", api_key=API_KEY))
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws_ping_interval=None)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.started
    yield f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription"
    srv.should_exit = True
    thread.join(timeout=120)
    assert not thread.is_alive()


def realtime_transcript(url: str, audio: np.ndarray, server_vad: bool) -> str:
    """The utterances' transcripts of one session fed ``audio`` at 16 kHz in 0.5 s pieces."""
    websockets = require_oracle("websockets")

    async def next_event(ws) -> dict:
        return json.loads(await asyncio.wait_for(ws.recv(), EVENT_TIMEOUT))

    async def talk() -> list[str]:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with websockets.connect(
            url, max_size=None, ping_interval=None, additional_headers=headers
        ) as ws:
            assert (await next_event(ws))["type"] == "session.created"
            detection = {"type": "server_vad"} if server_vad else None
            session = {
                "type": "transcription",
                "audio": {
                    "input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": detection}
                },
            }
            await ws.send(json.dumps({"type": "session.update", "session": session}))
            assert (await next_event(ws))["type"] == "session.updated"
            pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
            for i in range(0, len(pcm), 16000):
                piece = base64.b64encode(pcm[i : i + 16000]).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
            if not server_vad:
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            await ws.send(json.dumps({"type": "marker.after.audio"}))  # answered after every append
            transcripts = []
            for _ in range(1000):
                event = await next_event(ws)
                if event["type"] == COMPLETED:
                    transcripts.append(event["transcript"])
                if event["type"] == "error" and event["error"]["code"] == "unknown_event_type":
                    break
            if not server_vad:  # the commit's transcript may come after the marker's answer
                while not transcripts:
                    event = await next_event(ws)
                    if event["type"] == COMPLETED:
                        transcripts.append(event["transcript"])
            return transcripts

    return " ".join(asyncio.run(talk()))


@pytest.mark.parametrize("server_vad", [True, False], ids=["server_vad", "manual_commit"])
def test_realtime_websocket_has_the_words_of_transcribe(server, speech_dir, offline, server_vad):
    audio = load_audio(speech_dir / JFK)
    if server_vad:  # 1.5 s of silence closes the utterance
        audio = np.concatenate([audio, np.zeros(24000, np.float32)])
    transcript = realtime_transcript(server, audio, server_vad)
    assert normalize_text(transcript) == normalize_text(offline), transcript
