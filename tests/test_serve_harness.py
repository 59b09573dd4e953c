"""A real uvicorn server on 127.0.0.1 for the serve tests, and the checks of its plain endpoints.

``live_server(app)`` binds a free loopback port, runs uvicorn in a thread, and stops it (draining the
scheduler) when the block ends; every wait in it is bounded.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import require_oracle

require_oracle("fastapi")
uvicorn = require_oracle("uvicorn")

API_KEY = "test-key"
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 120


@contextlib.contextmanager
def live_server(app) -> Iterator[str]:
    """Serve ``app`` on a free 127.0.0.1 port; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=STOP_TIMEOUT_S)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT_S)
        sock.close()
        assert not thread.is_alive(), "the test server did not stop"


def make_app(model, *, api_key: str | None = API_KEY, max_upload_bytes: int = 8 * 2**20, **scheduler_args):
    from whisperkv.engine import Scheduler
    from whisperkv.serve import ServeSettings, create_app

    scheduler = Scheduler(model, **scheduler_args)
    settings = ServeSettings(model_name="tiny.en", api_key=api_key, max_upload_bytes=max_upload_bytes)
    return create_app(model, scheduler, settings)


def write_wav(path: Path, waveform: np.ndarray) -> Path:
    """A 16 kHz mono 16-bit WAV of a waveform that came from load_audio (exact round trip)."""
    samples = np.round(waveform * 32768.0).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(samples.tobytes())
    return path


def auth(key: str = API_KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def server(tiny_model) -> Iterator[str]:
    with live_server(make_app(tiny_model)) as url:
        yield url


def test_health_models_and_metrics(server, speech_dir):
    with httpx.Client(base_url=server, timeout=60) as http:
        health = http.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        models = http.get("/v1/models", headers=auth())
        assert models.status_code == 200
        body = models.json()
        assert body["object"] == "list"
        assert {m["id"] for m in body["data"]} == {"tiny.en", "whisper-1"}
        assert all(m["object"] == "model" and isinstance(m["created"], int) for m in body["data"])
        assert http.get("/v1/models/whisper-1", headers=auth()).json()["id"] == "whisper-1"
        missing = http.get("/v1/models/gpt-4o-transcribe", headers=auth())
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"

        with open(speech_dir / "en" / "ls_1089-134691-0000.flac", "rb") as f:
            files = {"file": ("clip.flac", f, "audio/flac")}
            answer = http.post(
                "/v1/audio/transcriptions", files=files, data={"model": "whisper-1"}, headers=auth()
            )
        assert answer.status_code == 200, answer.text
        assert "wait" in answer.json()["text"].lower()

        assert http.get("/metrics").status_code == 401  # the key guards the metrics too
        metrics = http.get("/metrics", headers=auth())
        assert metrics.status_code == 200
        text = metrics.text
        for name in (
            "whisperkv_queue_depth",
            "whisperkv_active_rows",
            "whisperkv_batch_rows",
            "whisperkv_tokens_per_second",
            "whisperkv_self_kv_bytes",
            "whisperkv_cross_kv_bytes",
            "whisperkv_decoded_tokens_total",
        ):
            assert f"\n{name} " in text, name
        done = 'whisperkv_request_duration_seconds_count{endpoint="/v1/audio/transcriptions"} 1.0'
        assert done in text
        tokens = float(text.split("\nwhisperkv_decoded_tokens_total ")[1].split()[0])
        assert tokens > 0  # the request above decoded through the scheduler
        windows = float(text.split("\nwhisperkv_windows_encoded_total ")[1].split()[0])
        encoder_s = float(text.split("\nwhisperkv_encoder_seconds_total ")[1].split()[0])
        assert windows >= 1 and encoder_s > 0  # at least the clip above (benchmarks/serve.py's ceiling)


def test_stream_sends_one_delta_per_segment_then_done(server, tiny_model, speech_dir):
    openai = require_oracle("openai")
    import torch

    clip = speech_dir / "en" / "ls_1089-134686-0000.flac"
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=API_KEY, max_retries=0, timeout=300)
    with open(clip, "rb") as f:
        events = list(client.audio.transcriptions.create(file=f, model="whisper-1", stream=True))
    torch.manual_seed(0)
    solo = tiny_model.transcribe(str(clip))
    assert [e.type for e in events] == ["transcript.text.delta"] * len(solo["segments"]) + [
        "transcript.text.done"
    ]
    assert [e.delta for e in events[:-1]] == [s["text"] for s in solo["segments"]]
    assert events[-1].text == solo["text"]
