"""Fuzzing the HTTP API with schemathesis, over the server's own OpenAPI schema, against a real server.

The server is ``whisperkv serve`` (tiny.en) on 127.0.0.1. schemathesis reads ``/openapi.json`` (the audio
routes' multipart form included, see ``whisperkv/serve/openapi_form.py``) and generates requests that fit
it and requests that do not, with a fixed seed and a fixed number of examples. Every answer must come in
bounded time and below 500; after the run the server is healthy and its log holds no traceback. The
default run is small; ``-m slow`` runs more.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import require_oracle

schemathesis = require_oracle("schemathesis")

REPO = Path(__file__).resolve().parents[1]
API_KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
#: seconds any one answer may take (a loaded 2-core machine; these requests never decode long audio)
ANSWER_S = 20.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``whisperkv serve`` (tiny.en) on a free 127.0.0.1 port, in its own process: the model's kernels
    set the floating-point state of the process that loads them (denormals flushed), which hypothesis
    refuses to generate floats under; and the log is the real server's."""
    log_path = tmp_path_factory.mktemp("fuzz") / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("WHISPERKV_API_KEY", None)
    options = ["--port", "0", "--api_key", API_KEY, "--max_upload_mb", "1", "--body_timeout", "10"]
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "whisperkv", "serve", *options],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while "listening on http://" not in (text := log_path.read_text()):
            assert process.poll() is None and time.monotonic() < deadline, text
            time.sleep(0.1)
        base = text.split("listening on ")[1].split()[0]
        while not _healthy(base):
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        yield base, log_path
    finally:
        process.terminate()
        process.wait(60)


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=ANSWER_S).status_code == 200
    except httpx.TransportError:
        return False


def _fuzz(base: str, examples: int) -> dict[int, int]:
    """Run ``examples`` generated requests (valid and invalid by the schema); the count of each status."""
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json", headers=AUTH, timeout=30)
    cases = st.one_of(
        schema.as_strategy(schemathesis.GenerationMode.POSITIVE),
        schema.as_strategy(schemathesis.GenerationMode.NEGATIVE),
    )
    statuses: dict[int, int] = {}

    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,  # the same requests every run
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(cases)
    def one_request(case) -> None:
        started = time.monotonic()
        response = case.call(base_url=base, headers=AUTH, timeout=ANSWER_S)
        took = time.monotonic() - started
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        summary = f"{case.method} {case.formatted_path} -> {response.status_code} in {took:.1f} s"
        assert response.status_code < 500, f"{summary}: {response.text[:300]}"
        assert took < ANSWER_S, summary

    one_request()
    return statuses


def _check_after(base: str, log_path: Path) -> None:
    assert _healthy(base)
    log = log_path.read_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]


def test_fuzzing_the_schema_finds_no_5xx_and_leaves_the_server_healthy(server):
    base, log_path = server
    statuses = _fuzz(base, examples=60)
    assert sum(statuses.values()) >= 60 and any(400 <= s < 500 for s in statuses), statuses
    _check_after(base, log_path)


@pytest.mark.slow
def test_fuzzing_the_schema_at_length(server):
    base, log_path = server
    _fuzz(base, examples=1000)
    _check_after(base, log_path)
