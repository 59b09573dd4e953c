"""SIGTERM on a real ``whisperkv serve`` process: a request in flight is answered in full, a new one gets
503 (and /health says shutting down), and the process exits 0; a second SIGTERM exits at once (143),
without a traceback."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import torch

from tests.conftest import SPEECH_DIR

REPO = Path(__file__).resolve().parents[1]
CLIP = SPEECH_DIR / "en" / "mfa_acoustic_corpus.wav"  # ~26 s: long enough to still be running at SIGTERM


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _healthy(http: httpx.Client) -> bool:
    try:
        return http.get("/health").status_code == 200
    except httpx.TransportError:
        return False


def _active_jobs(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    return float(text.split("\nwhisperkv_active_jobs ")[1].split()[0])


@contextlib.contextmanager
def _server(tmp_path: Path, *options: str) -> Iterator[tuple[subprocess.Popen, httpx.Client, list[str]]]:
    """A ``whisperkv serve`` process on a free 127.0.0.1 port, started and healthy; killed if it is still
    running at the end. The list holds its output once it has stopped."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("WHISPERKV_API_KEY", None)
    output: list[str] = []
    with open(tmp_path / "server.log", "w+") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "whisperkv", "serve", "--port", str(port), *options],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
                _wait(lambda: server.poll() is None and _healthy(http), 120, "the server to start")
                yield server, http, output
        finally:
            if server.poll() is None:
                server.kill()
                server.wait(10)
            log.seek(0)
            output.append(log.read())


def _transcribe(http: httpx.Client, **data: str) -> httpx.Response:
    files = {"file": (CLIP.name, CLIP.read_bytes(), "audio/wav")}
    return http.post("/v1/audio/transcriptions", files=files, data={"model": "whisper-1", **data})


def test_sigterm_finishes_in_flight_refuses_new_and_exits_0(tmp_path, tiny_model, speech_dir):
    in_flight: dict = {}
    with _server(tmp_path, "--max_upload_mb", "4") as (server, http, output):
        worker = threading.Thread(target=lambda: in_flight.update(response=_transcribe(http, beam_size="5")))
        worker.start()
        _wait(lambda: _active_jobs(http) >= 1, 60, "the job to start")
        server.send_signal(signal.SIGTERM)
        _wait(lambda: http.get("/health").status_code == 503, 10, "/health to report shutdown")
        refused = _transcribe(http)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        worker.join(300)
        assert not worker.is_alive()
        assert server.wait(timeout=120) == 0
    assert "Traceback" not in output[0], output[0]
    response = in_flight["response"]
    assert response.status_code == 200, output[0]
    torch.manual_seed(0)
    assert response.json()["text"] == tiny_model.transcribe(str(CLIP), beam_size=5)["text"]


def test_a_second_sigterm_exits_at_once_with_143_and_no_traceback(tmp_path):
    def in_flight() -> None:
        try:
            _transcribe(http, beam_size="5")
        except httpx.TransportError:
            pass  # the server exited under it: what a forced exit does

    with _server(tmp_path) as (server, http, output):
        threading.Thread(target=in_flight, daemon=True).start()  # the first signal alone would wait for it
        _wait(lambda: _active_jobs(http) >= 1, 60, "the job to start")
        server.send_signal(signal.SIGTERM)
        _wait(lambda: http.get("/health").status_code == 503, 10, "/health to report shutdown")
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=10) == 128 + signal.SIGTERM
        assert time.monotonic() - started < 10
    assert "Traceback" not in output[0], output[0]
    assert "again: exiting now" in output[0]
