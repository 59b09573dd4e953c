"""``whisperkv serve --idle_trim``: an idle server gives its heap's free memory back (counted in /metrics),
and a bad value is refused before anything loads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.conftest import SPEECH_DIR
from tests.test_serve_sigterm import REPO, _server, _wait


def _heap_trims(http) -> float:  # noqa: ANN001 - an httpx.Client
    text = http.get("/metrics").text
    return float(text.split("\nwhisperkv_heap_trims_total ")[1].split()[0])


def test_an_idle_server_gives_its_heap_back_once_per_spell(tmp_path):
    clip = SPEECH_DIR / "en" / "jfk.flac"
    with _server(tmp_path, "--idle_trim", "0.3") as (server, http, output):
        assert _heap_trims(http) == 0  # nothing served yet: nothing to give back
        files = {"file": (clip.name, clip.read_bytes(), "audio/flac")}
        response = http.post("/v1/audio/transcriptions", files=files, data={"model": "whisper-1"})
        assert response.status_code == 200
        assert "ask not what your country can do for you" in response.json()["text"]
        _wait(lambda: _heap_trims(http) == 1, 30, "the idle trim")
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    assert "Traceback" not in output[0], output[0]


def test_a_bad_idle_trim_is_refused_by_name():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for value in ("-1", "inf", "soon"):
        proc = subprocess.run(
            [sys.executable, "-m", "whisperkv", "serve", "--idle_trim", value],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert "argument --idle_trim" in proc.stderr and "Traceback" not in proc.stderr
