"""SIGTERM on a real ``whisperkv serve`` process: a request in flight is answered in full, a new one gets
503 (and /health says shutting down), and the process exits 0; a second SIGTERM exits at once (143),
without a traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
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


def test_sigterm_finishes_in_flight_refuses_new_and_exits_0(tmp_path, tiny_model, speech_dir):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("WHISPERKV_API_KEY", None)
    log = open(tmp_path / "server.log", "w+")
    server = subprocess.Popen(
        [sys.executable, "-m", "whisperkv", "serve", "--port", str(port), "--max_upload_mb", "4"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            _wait(lambda: server.poll() is None and _healthy(http), 120, "the server to start")
            in_flight: dict = {}

            def request() -> None:
                files = {"file": (CLIP.name, CLIP.read_bytes(), "audio/wav")}
                in_flight["response"] = http.post(
                    "/v1/audio/transcriptions", files=files, data={"model": "whisper-1", "beam_size": "5"}
                )

            worker = threading.Thread(target=request)
            worker.start()
            _wait(lambda: _active_jobs(http) >= 1, 60, "the job to start")
            server.send_signal(signal.SIGTERM)
            _wait(lambda: http.get("/health").status_code == 503, 10, "/health to report shutdown")
            refused = http.post(
                "/v1/audio/transcriptions",
                files={"file": (CLIP.name, CLIP.read_bytes(), "audio/wav")},
                data={"model": "whisper-1"},
            )
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "shutting_down"
            worker.join(300)
            assert not worker.is_alive()
        assert server.wait(timeout=120) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
        log.seek(0)
        output = log.read()
        log.close()
    assert "Traceback" not in output, output
    response = in_flight["response"]
    assert response.status_code == 200, output
    torch.manual_seed(0)
    assert response.json()["text"] == tiny_model.transcribe(str(CLIP), beam_size=5)["text"]


def test_a_second_sigterm_exits_at_once_with_143_and_no_traceback(tmp_path):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("WHISPERKV_API_KEY", None)
    log = open(tmp_path / "server.log", "w+")
    server = subprocess.Popen(
        [sys.executable, "-m", "whisperkv", "serve", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            _wait(lambda: server.poll() is None and _healthy(http), 120, "the server to start")
            worker = threading.Thread(  # a job in flight: the first signal alone would wait for it
                target=lambda: _post_ignoring_reset(http), daemon=True
            )
            worker.start()
            _wait(lambda: _active_jobs(http) >= 1, 60, "the job to start")
            server.send_signal(signal.SIGTERM)
            _wait(lambda: http.get("/health").status_code == 503, 10, "/health to report shutdown")
            started = time.monotonic()
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=10) == 128 + signal.SIGTERM
            assert time.monotonic() - started < 10
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
        log.seek(0)
        output = log.read()
        log.close()
    assert "Traceback" not in output, output
    assert "again: exiting now" in output


def _post_ignoring_reset(http: httpx.Client) -> None:
    files = {"file": (CLIP.name, CLIP.read_bytes(), "audio/wav")}
    try:
        http.post("/v1/audio/transcriptions", files=files, data={"model": "whisper-1", "beam_size": "5"})
    except httpx.TransportError:
        pass  # the server exited under it: what a forced exit does
