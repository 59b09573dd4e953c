"""The Realtime transcription WebSocket against a real server on 127.0.0.1, with the websockets client."""

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
from whisperkv.metrics import wer
from whisperkv.serve.realtime import CHUNK_S
from whisperkv.stream.local_decoder import LocalDecoder
from whisperkv.stream.pcm import Resampler
from whisperkv.stream.session import StreamingSession
from whisperkv.stream.vad import SpeechDetector

websockets = require_oracle("websockets")
uvicorn = require_oracle("uvicorn")

JFK_TEXT = (
    "And so my fellow Americans, ask not what your country can do for you, "
    "ask what you can do for your country."
)
API_KEY = "stream-test-key"
EVENT_TIMEOUT = 120  # seconds for any one server event (a loaded 2-core machine)
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_app(model):
    """The server's own app (``create_app``) with the engine's Scheduler and an API key."""
    from whisperkv.engine import Scheduler
    from whisperkv.serve import ServeSettings, create_app

    return create_app(model, Scheduler(model), ServeSettings(model_name="tiny.en", api_key=API_KEY))


@pytest.fixture(scope="module")
def app(tiny_model):
    return serve_app(tiny_model)


@pytest.fixture(scope="module")
def server(app):
    port = free_port()
    # no keepalive pings: client and server share this process, and a decode may hold the GIL for a while
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


def pcm_bytes(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def pcm_b64(samples: np.ndarray) -> str:
    return base64.b64encode(pcm_bytes(samples)).decode()


def in_process_twin(
    model, pieces: list[bytes], rate: int, confident: float | None = None
) -> tuple[str, dict, list[str]]:
    """``whisperkv stream``'s path (``LocalDecoder``, the same VAD) fed what a server session was fed, on
    the session's schedule: each append resampled to 16 kHz and fed, an update once ``CHUNK_S`` of new
    audio has come. Its committed text, reuse counts and each commit's text, in order."""
    session = StreamingSession(LocalDecoder(model), vad=SpeechDetector(), confident=confident)
    session.warm()
    resample, pending, events = Resampler(rate), 0, []
    for piece in pieces:
        samples = resample(piece)
        events += session.feed(samples)
        pending += len(samples)
        if pending >= CHUNK_S * 16000:
            pending = 0
            events += session.update()
    commits = [event.text for event in events if event.type == "commit"]
    return session.committed_text(), session.reuse_summary(), commits


def metric_values(app) -> dict:
    """The app's stream counters as /metrics has them: (kind, accepted | refused) and (what, work)."""
    registry = app.state.metrics.registry
    values = {}
    for kind in ("encoder_output", "cross_kv", "prompt_self_kv"):
        for outcome in ("accepted", "refused"):
            labels = {"kind": kind, "outcome": outcome}
            values[(kind, outcome)] = registry.get_sample_value("whisperkv_stream_reuse_total", labels) or 0
    for what in ("updates", "encodes"):
        values[(what, "work")] = (
            registry.get_sample_value("whisperkv_stream_updates_total", {"what": what}) or 0
        )
    return values


async def next_event(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), EVENT_TIMEOUT))


async def until(ws, kind: str, seen: list[dict], limit: int = 500) -> dict:
    for _ in range(limit):
        event = await next_event(ws)
        seen.append(event)
        if event["type"] == kind:
            return event
    raise AssertionError(f"no {kind} in {limit} events")


@pytest.fixture(scope="module")
def jfk(speech_dir) -> np.ndarray:
    return load_audio(speech_dir / "en/jfk.flac")


async def append_all(ws, pieces: list[bytes], seen: list[dict]) -> None:
    """Append every piece, then collect the events they bring into ``seen``: events are handled in order,
    so the error answering a marker sent after them comes after every append's events."""
    for piece in pieces:
        await ws.send(
            json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()})
        )
    await ws.send(json.dumps({"type": "marker.after.audio"}))
    await until(ws, "error", seen)


async def send_bad_frames(ws) -> None:
    """Bad audio, an unknown event, bad JSON, a binary frame and bad session updates, one at a time: each
    answered by an error event with its code and a message."""
    bad = [
        json.dumps({"type": "input_audio_buffer.append", "audio": "%%% not base64"}),
        json.dumps(
            {"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x01\x02\x03").decode()}
        ),
        json.dumps({"type": "no.such.event"}),
        "{not json",
        b"\x00\x01",
        json.dumps({"type": "session.update", "session": {"audio": {"input": {"format": {"rate": 8000}}}}}),
        json.dumps({"type": "session.update", "session": {"audio": "pcm"}}),
        json.dumps(
            {
                "type": "session.update",
                "session": {"audio": {"input": {"transcription": {"language": "fr"}}}},
            }
        ),
    ]
    codes = [
        "invalid_audio",
        "invalid_audio",
        "unknown_event_type",
        "invalid_json",
        "invalid_frame",
        "invalid_rate",
        "invalid_value",
        "invalid_language",
    ]
    for frame, code in zip(bad, codes, strict=True):
        await ws.send(frame)
        error = await next_event(ws)
        assert error["type"] == "error" and error["error"]["code"] == code and error["error"]["message"]


def assert_utterances(seen: list[dict]) -> tuple[list[dict], str]:
    """The VAD's speech started before it stopped, the transcript within 25% word errors of jfk's, each
    utterance's deltas adding up to its transcript. The completed events and the whole transcript."""
    kinds = [e["type"] for e in seen]
    assert "input_audio_buffer.speech_started" in kinds and "input_audio_buffer.speech_stopped" in kinds
    assert kinds.index("input_audio_buffer.speech_started") < kinds.index("input_audio_buffer.speech_stopped")
    completed = [e for e in seen if e["type"] == "conversation.item.input_audio_transcription.completed"]
    transcript = " ".join(e["transcript"] for e in completed)
    assert wer(JFK_TEXT, transcript) <= 0.25
    for item in completed:  # each utterance's deltas add up to its transcript
        deltas = [
            e["delta"] for e in seen if e.get("item_id") == item["item_id"] and e["type"].endswith(".delta")
        ]
        assert "".join(deltas) == item["transcript"]
    return completed, transcript


def assert_served_as_in_process(
    app, pieces: list[bytes], completed: list[dict], transcript: str, reuse_before: dict
) -> None:
    """The server's stream is the in-process one: the same words (exactly), the same reuse by provenance;
    and /metrics adds the session's counts to what it had before."""
    text, reuse, _ = in_process_twin(app.state.model, pieces, 24000)
    assert " ".join(transcript.split()) == " ".join(text.split())
    served = completed[-1]["reuse"]
    assert served == reuse and served["encodes"] < served["updates"]
    assert served["accepted"]["encoder_output"] > 0 and served["accepted"]["prompt_self_kv"] > 0
    counted = metric_values(app)  # /metrics adds each session's counts
    for kind in ("encoder_output", "cross_kv", "prompt_self_kv"):
        gained = counted[(kind, "accepted")] - reuse_before[(kind, "accepted")]
        assert gained == served["accepted"][kind]
    assert counted[("updates", "work")] - reuse_before[("updates", "work")] == served["updates"]


def test_server_vad_session_at_24khz_transcribes_and_survives_bad_frames(server, app, jfk):
    audio_24k = np.interp(np.arange(0, len(jfk), 2 / 3), np.arange(len(jfk)), jfk).astype(np.float32)
    audio_24k = np.concatenate(
        [audio_24k, np.zeros(36000, np.float32)]
    )  # 1.5 s of silence closes the utterance

    async def talk() -> list[dict]:
        seen: list[dict] = []
        async with websockets.connect(
            server, max_size=None, ping_interval=None, additional_headers=AUTH
        ) as ws:
            assert (await next_event(ws))["type"] == "session.created"
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription"}}))
            updated = await next_event(ws)
            assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
            await send_bad_frames(ws)
            await append_all(ws, pieces, seen)
        return seen

    pieces = [pcm_bytes(audio_24k[i : i + 12000]) for i in range(0, len(audio_24k), 12000)]  # 0.5 s each
    steps_before = app.state.scheduler.stats()["steps_total"]
    reuse_before = metric_values(app)
    seen = asyncio.run(talk())
    assert app.state.scheduler.stats()["steps_total"] > steps_before  # decoded by the server's scheduler
    completed, transcript = assert_utterances(seen)
    assert_served_as_in_process(app, pieces, completed, transcript, reuse_before)


def test_a_confident_session_commits_as_the_in_process_stream_with_it(server, app, jfk):
    """``transcription.confident`` (whisperkv's extension) reaches the session's stream: its deltas are
    the commits of ``StreamingSession(confident=0.5)`` fed the same audio on the same schedule, which
    are not LocalAgreement-2's; null turns it off again; 0, 1.5, true and NaN are error events naming it."""
    audio = np.concatenate([jfk, np.zeros(24000, np.float32)])  # 1.5 s of silence closes the utterance
    pieces = [pcm_bytes(audio[i : i + 8000]) for i in range(0, len(audio), 8000)]  # 0.5 s each

    def update(confident) -> str:
        transcription = {"confident": confident}
        audio_input = {"format": {"type": "audio/pcm", "rate": 16000}, "transcription": transcription}
        return json.dumps({"type": "session.update", "session": {"audio": {"input": audio_input}}})

    async def talk() -> tuple[list[dict], list[dict]]:
        seen, answers = [], []
        async with websockets.connect(
            server, max_size=None, ping_interval=None, additional_headers=AUTH
        ) as ws:
            assert (await next_event(ws))["type"] == "session.created"
            for bad in (0, 1.5, True, "0.5", float("nan")):
                await ws.send(update(bad))
                answers.append(await next_event(ws))
            for confident in (0.9, None, 0.5):
                await ws.send(update(confident))
                answers.append(await next_event(ws))
            await append_all(ws, pieces, seen)
        return seen, answers

    seen, answers = asyncio.run(talk())
    for error in answers[:5]:
        assert error["type"] == "error" and error["error"]["code"] == "invalid_value", error
        assert error["error"]["param"] == "session.audio.input.transcription.confident"
    settings = [a["session"]["audio"]["input"]["transcription"]["confident"] for a in answers[5:]]
    assert settings == [0.9, None, 0.5]
    deltas = [e["delta"].strip() for e in seen if e["type"].endswith("transcription.delta")]
    text, _, commits = in_process_twin(app.state.model, pieces, 16000, confident=0.5)
    assert deltas == commits and wer(JFK_TEXT, text) <= 0.25
    assert commits != in_process_twin(app.state.model, pieces, 16000)[2]


def test_openai_client_manual_commit_without_vad_and_empty_commit_is_an_error(server, jfk):
    """The official client's realtime connection, pointed at the local server, in manual-commit mode."""
    openai = require_oracle("openai")
    base = server.split("/v1/")[0]
    client = openai.OpenAI(
        api_key=API_KEY, base_url=base.replace("ws://", "http://") + "/v1", websocket_base_url=base + "/v1"
    )
    seen = []
    with client.realtime.connect(
        extra_query={"intent": "transcription"}, websocket_connection_options={"ping_interval": None}
    ) as conn:
        assert conn.recv().type == "session.created"
        conn.session.update(
            session={
                "type": "transcription",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}, "turn_detection": None}},
            }
        )
        assert conn.recv().session.audio.input.turn_detection is None
        conn.input_audio_buffer.commit()
        assert conn.recv().error.code == "input_audio_buffer_commit_empty"
        for i in range(0, 3 * 16000, 8000):
            conn.input_audio_buffer.append(audio=pcm_b64(jfk[i : i + 8000]))
        conn.input_audio_buffer.commit()
        for _ in range(200):
            event = conn.recv()
            seen.append(event)
            if event.type == "conversation.item.input_audio_transcription.completed":
                break
        conn.input_audio_buffer.clear()
        assert conn.recv().type == "input_audio_buffer.cleared"
    kinds = [e.type for e in seen]
    assert "input_audio_buffer.committed" in kinds
    completed = seen[-1]
    assert completed.type == "conversation.item.input_audio_transcription.completed"
    assert kinds.index("input_audio_buffer.committed") < len(kinds) - 1
    assert "fellow americans" in completed.transcript.lower()
    deltas = [e.delta for e in seen if e.type == "conversation.item.input_audio_transcription.delta"]
    assert "".join(deltas) == completed.transcript


def test_missing_key_and_wrong_intent_are_refused_before_the_handshake(server):
    async def refused(url: str, headers: dict) -> tuple[dict, int]:
        with pytest.raises(websockets.InvalidStatus) as answer:
            async with websockets.connect(url, ping_interval=None, additional_headers=headers):
                pass
        response = answer.value.response
        return json.loads(response.body), response.status_code

    body, status = asyncio.run(refused(server, {}))
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    body, status = asyncio.run(refused(server.replace("intent=transcription", "intent=conversation"), AUTH))
    assert status == 400 and body["error"]["code"] == "unsupported_intent"


def test_a_session_never_takes_another_sessions_window(tiny_model, jfk):
    """Two sessions on the same audio: each encodes for itself (provenance names the session), a window
    handed from one to the other is refused on ``request_id`` and encoded again, while a session's own
    window is reused when its update is exactly the same."""
    from whisperkv.cache.provenance import first_difference
    from whisperkv.engine import Scheduler
    from whisperkv.serve.realtime_decoder import SchedulerDecoder

    scheduler = Scheduler(tiny_model)
    scheduler.start()
    try:
        a = SchedulerDecoder(scheduler, tiny_model, "en", "sess_a")
        b = SchedulerDecoder(scheduler, tiny_model, "en", "sess_b")
        buffer = jfk[: 4 * 16000]
        first = a.decode(buffer, 0, "")
        assert b.decode(buffer, 0, "").words == first.words
        window_a, window_b = a.state.previous, b.state.previous
        assert first_difference(window_a.provenance, window_b.provenance)[0] == "request_id"
        b.state.previous = window_a  # as a bug that mixed up sessions would hand it over
        assert b.decode(buffer, 0, "").words == first.words
        assert b.reuse_summary()["refused"]["encoder_output"] == {"request_id": 1}
        assert b.state.encodes == 2 and b.state.previous is not window_a
        assert a.decode(buffer, 0, "").words == first.words  # its own, unchanged: reused
        summary = a.reuse_summary()
        assert summary["accepted"] == {"encoder_output": 1, "cross_kv": 1, "prompt_self_kv": 1}
        assert a.state.encodes == 1 and a.state.updates == 2
        assert LocalDecoder(tiny_model).decode(buffer, 0, "").words == first.words  # the in-process words
    finally:
        scheduler.stop()
