"""The Realtime socket against hostile clients: a real server on 127.0.0.1 and the websockets client.

The app is the server's own (``create_app``) around tiny.en and a stand-in scheduler that decodes nothing
(each update's job answers no words), so what is tested is the socket's handling (admission, parsing,
caps, cancellation) in a second or two; decoding through the real scheduler is
tests/test_stream_realtime.py's. The event parser tried with hypothesis, and the message cap's
arithmetic, are tests/test_realtime_hostile_parser.py's (no server).
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
from whisperkv.errors import JobCancelledError
from whisperkv.serve.realtime import max_message_chars
from whisperkv.stream.hypothesis import Hypothesis

websockets = require_oracle("websockets")
uvicorn = require_oracle("uvicorn")

API_KEY = "hostile-realtime-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
BUFFER_S = 5.0
SESSIONS = 2
TIMEOUT = 20  # seconds for any one server event
LOOP_THREAD: list[threading.Thread] = []


class StandInHandle:
    """A scheduler job that answers no words at once, or (``block``) waits until it is cancelled."""

    def __init__(self, request_id: str, block: bool) -> None:
        self.request_id = request_id
        self.block = block
        self.cancelled = threading.Event()

    def result(self, timeout: float | None = None) -> dict:
        if self.block:
            if not self.cancelled.wait(60):
                raise TimeoutError("never cancelled")
            raise JobCancelledError(f"job {self.request_id} was cancelled")
        return {"hypothesis": Hypothesis()}

    def cancel(self) -> None:
        self.cancelled.set()


class StandInScheduler:
    def __init__(self) -> None:
        self.block = False
        self.handles: list[StandInHandle] = []

    def start(self) -> None:
        pass

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        pass

    def stats(self) -> dict:
        return {}

    def submit_job(self, job) -> StandInHandle:
        handle = StandInHandle(job.request_id, self.block)
        self.handles.append(handle)
        return handle


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app(tiny_model):
    from whisperkv.serve import ServeSettings, create_app

    settings = ServeSettings(
        api_key=API_KEY, realtime_max_sessions=SESSIONS, realtime_buffer_s=BUFFER_S, model_name="tiny.en"
    )
    return create_app(tiny_model, StandInScheduler(), settings)


@pytest.fixture(scope="module")
def url(app):
    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws_ping_interval=None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    LOOP_THREAD.append(thread)  # the server's event loop runs in it
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield f"ws://127.0.0.1:{port}/v1/realtime?intent=transcription"
    server.should_exit = True
    thread.join(timeout=30)


def pcm(seconds: float, rate: int = 16000) -> str:
    rng = np.random.default_rng(0)
    samples = (rng.standard_normal(int(seconds * rate)) * 3000).astype("<i2")
    return base64.b64encode(samples.tobytes()).decode()


async def recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def connect(url: str):
    ws = await websockets.connect(url, ping_interval=None, additional_headers=AUTH, max_size=None)
    assert (await recv(ws))["type"] == "session.created"
    return ws


async def manual_commit(ws) -> None:
    update = {
        "type": "session.update",
        "session": {"audio": {"input": {"turn_detection": None, "format": {"rate": 16000}}}},
    }
    await ws.send(json.dumps(update))
    assert (await recv(ws))["type"] == "session.updated"


def refused(url: str, headers: dict) -> tuple[int, dict]:
    async def attempt() -> tuple[int, dict]:
        with pytest.raises(websockets.InvalidStatus) as answer:
            async with websockets.connect(url, ping_interval=None, additional_headers=headers):
                pass
        return answer.value.response.status_code, json.loads(answer.value.response.body)

    return asyncio.run(attempt())


def _deep(depth: int) -> str:
    return '{"type": "session.update", "session": ' + "[" * depth + "]" * depth + "}"


MALFORMED = [  # (frame, the error code it must get)
    (
        json.dumps(
            {
                "type": "session.update",
                "session": {"audio": {"input": {"transcription": {"language": ["en"]}}}},
            }
        ),
        "invalid_language",
    ),
    (
        json.dumps(
            {
                "type": "session.update",
                "session": {"audio": {"input": {"transcription": {"language": {"a": 1}}}}},
            }
        ),
        "invalid_language",
    ),
    ("[" * 100_000 + "]" * 100_000, "invalid_json"),  # RecursionError in json.loads
    (_deep(100_000), "invalid_json"),
    (json.dumps({"type": "no.such.event"}), "unknown_event_type"),
    (json.dumps({"type": ["input_audio_buffer.append"]}), "invalid_event"),
    (json.dumps(["not", "an", "object"]), "invalid_event"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": "%%% not base64"}), "invalid_audio"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": 12345}), "invalid_audio"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": {"nested": [1, 2]}}), "invalid_audio"),
    (
        json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA"}),
        "invalid_audio",
    ),  # 3 bytes: not PCM16
    (json.dumps({"type": "session.update", "session": []}), "invalid_session"),
    (
        json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": {"rate": True}}}}}),
        "invalid_rate",
    ),
    (
        json.dumps(
            {"type": "session.update", "session": {"audio": {"input": {"format": {"rate": [16000]}}}}}
        ),
        "invalid_rate",
    ),
    (
        json.dumps({"type": "session.update", "session": {"audio": {"input": {"turn_detection": "yes"}}}}),
        "invalid_turn_detection",
    ),
    (
        json.dumps(
            {"type": "session.update", "session": {"audio": {"input": {"transcription": {"prompt": 7}}}}}
        ),
        "invalid_value",
    ),
    (json.dumps({"type": "input_audio_buffer.clear", "event_id": {"deep": [[[]]]}}), "invalid_value"),
    (b"\x00\x01binary", "invalid_frame"),
    (json.dumps({"type": "input_audio_buffer.commit"}), "input_audio_buffer_commit_empty"),
]


def test_every_malformed_event_is_an_error_event_and_the_session_goes_on(url):
    async def talk() -> list[tuple[str, dict]]:
        answers = []
        async with await connect(url) as ws:
            for frame, code in MALFORMED:
                await ws.send(frame)
                answers.append((code, await recv(ws)))
            await ws.send(json.dumps({"type": "input_audio_buffer.clear", "event_id": "ev-after"}))
            answers.append(("cleared", await recv(ws)))
            await ws.send(json.dumps({"type": "no.such", "event_id": "ev-echo"}))
            answers.append(("echo", await recv(ws)))
        return answers

    answers = asyncio.run(talk())
    for (code, event), (frame, _) in zip(answers, MALFORMED):
        assert event["type"] == "error", (frame[:80], event)
        assert event["error"]["code"] == code and event["error"]["message"], (frame[:80], event)
        assert "Traceback" not in event["error"]["message"]
    assert answers[-2][1]["type"] == "input_audio_buffer.cleared"  # still answering after all of them
    assert answers[-1][1]["error"]["event_id"] == "ev-echo"


def test_an_append_past_the_buffer_cap_is_refused_and_a_commit_frees_it(url, app):
    async def talk() -> list[dict]:
        async with await connect(url) as ws:
            await manual_commit(ws)
            seen = []
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": pcm(BUFFER_S - 1)}))
            await ws.send(
                json.dumps({"type": "input_audio_buffer.append", "audio": pcm(2), "event_id": "big"})
            )
            await ws.send(
                json.dumps({"type": "no.such.event"})
            )  # a marker: every event before it is answered
            while (event := await recv(ws))["type"] != "error" or event["error"][
                "code"
            ] != "unknown_event_type":
                seen.append(event)
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            while (event := await recv(ws))[
                "type"
            ] != "conversation.item.input_audio_transcription.completed":
                pass
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": pcm(2)}))
            await ws.send(json.dumps({"type": "no.such.event"}))
            while (event := await recv(ws))["type"] != "error" or event["error"][
                "code"
            ] != "unknown_event_type":
                seen.append(event)
            return seen

    seen = asyncio.run(talk())
    errors = [e["error"] for e in seen if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["input_audio_buffer_full"]  # the second 2 s fit after the commit
    assert errors[0]["event_id"] == "big" and "--realtime_buffer_s" in errors[0]["message"]


def test_a_message_over_the_size_cap_is_an_error_event(url):
    limit = max_message_chars(BUFFER_S)

    async def talk() -> tuple[dict, dict]:
        async with await connect(url) as ws:
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (limit + 4)}))
            too_big = await recv(ws)
            await ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
            return too_big, await recv(ws)

    too_big, after = asyncio.run(talk())
    assert too_big["error"]["code"] == "message_too_large" and str(limit) in too_big["error"]["message"]
    assert after["type"] == "input_audio_buffer.cleared"


def test_sessions_past_the_cap_and_bad_keys_are_refused_before_the_handshake(url, app):
    sessions = app.state.realtime_sessions
    assert refused(url, {})[0] == 401
    status, body = refused(url, {"Authorization": "Bearer wrong"})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert sessions.open == 0  # a refused client never held a session

    async def fill() -> tuple[int, dict, str]:
        held = [await connect(url) for _ in range(SESSIONS)]
        status, body = await asyncio.to_thread(refused, url, AUTH)
        await held[0].close()
        deadline = time.monotonic() + TIMEOUT
        while sessions.open >= SESSIONS and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        again = await connect(url)  # the closed session's place is free again
        kinds = (await asyncio.gather(*(ws.close() for ws in [*held[1:], again])), "ok")[1]
        return status, body, kinds

    status, body, ok = asyncio.run(fill())
    assert status == 503 and body["error"]["code"] == "too_many_sessions" and ok == "ok"
    deadline = time.monotonic() + TIMEOUT
    while sessions.open and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sessions.open == 0


def test_a_client_that_disconnects_cancels_its_update_job(url, app):
    scheduler = app.state.scheduler
    scheduler.block = True
    before = len(scheduler.handles)

    async def talk() -> None:
        ws = await connect(url)
        await manual_commit(ws)
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": pcm(1.5)}))
        deadline = time.monotonic() + TIMEOUT
        while len(scheduler.handles) == before:
            assert time.monotonic() < deadline, "no update job was submitted"
            await asyncio.sleep(0.02)
        await ws.close()

    try:
        asyncio.run(talk())
        job = scheduler.handles[-1]
        assert job.cancelled.wait(TIMEOUT), "the disconnect did not cancel the update job"
    finally:
        scheduler.block = False


def test_a_new_voice_detector_is_made_off_the_event_loop(url, monkeypatch):
    """A SpeechDetector loads silero (about 0.1 s): made on the loop, a client toggling turn detection
    would stall every other client."""
    from whisperkv.serve import realtime

    made_in: list[threading.Thread] = []

    class RecordedDetector(realtime.SpeechDetector):
        def __init__(self, *args, **kwargs) -> None:
            made_in.append(threading.current_thread())
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(realtime, "SpeechDetector", RecordedDetector)

    async def talk() -> None:
        async with await connect(url) as ws:  # the session's first detector
            for vad in (None, {"type": "server_vad"}):  # off, then on again: a second one
                update = {"type": "session.update", "session": {"audio": {"input": {"turn_detection": vad}}}}
                await ws.send(json.dumps(update))
                assert (await recv(ws))["type"] == "session.updated"

    asyncio.run(talk())
    assert len(made_in) == 2 and LOOP_THREAD[0] not in made_in
