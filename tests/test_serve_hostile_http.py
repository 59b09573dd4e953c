"""The HTTP server against hostile clients: slow bodies, clients that leave, the schema, Host-built
redirects, and start-up with a bad or busy port. A real server on 127.0.0.1 each time.

Most tests run the server's own app (``create_app``) in this process around a stand-in scheduler (the
requests here never reach decoding); the start-up and SIGTERM tests run ``whisperkv serve`` itself.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.conftest import require_oracle

uvicorn = require_oracle("uvicorn")

REPO = Path(__file__).resolve().parents[1]
API_KEY = "hostile-http-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
BODY_TIMEOUT_S = 1.0
BOUNDARY = "hostileboundary"


class StandInScheduler:
    def start(self) -> None:
        pass

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        pass

    def stats(self) -> dict:
        return {}


class EnglishModel:
    is_multilingual = False


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\nTraceback " + logging.Formatter().formatException(record.exc_info)
        self.lines.append(text)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def records():
    handler = Records()
    logger = logging.getLogger("uvicorn.error")
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(before)


def _serve(app) -> tuple[uvicorn.Server, threading.Thread, int]:
    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    return server, thread, port


@pytest.fixture(scope="module")
def base(records):
    from whisperkv.serve import ServeSettings, create_app

    settings = ServeSettings(api_key=API_KEY, body_timeout_s=BODY_TIMEOUT_S, max_upload_bytes=1024 * 1024)
    server, thread, port = _serve(create_app(EnglishModel(), StandInScheduler(), settings))
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)
    assert not [line for line in records.lines if "Traceback" in line or "Exception in ASGI" in line]


def _raw(base: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _upload_head(length: int) -> bytes:
    return (
        f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def _read_all(sock: socket.socket, limit_s: float) -> bytes:
    """What the server sends until it closes the connection (or ``limit_s`` passes), then ``<closed>``.

    A server that closes while the client's bytes still arrive unread closes with a reset, not a FIN
    (the kernel's rule for a socket closed with unread data): which one a test sees is a race between
    the trickle and the close, and both are the connection closed by the server."""
    sock.settimeout(0.2)
    data, deadline = b"", time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data + b"<closed>"
        except OSError:
            break
        if not chunk:
            return data + b"<closed>"
        data += chunk
    return data


def _trickle(sock: socket.socket, every_s: float, stop: Callable[[], bool]) -> None:
    """Send one body byte every ``every_s`` seconds from a thread, until ``stop()`` or the socket fails."""

    def send() -> None:
        while not stop():
            try:
                sock.sendall(b"x")
            except OSError:
                return
            time.sleep(every_s)

    threading.Thread(target=send, daemon=True).start()


def _stop_after(count: int) -> Callable[[], bool]:
    """A ``stop`` that lets ``count`` bytes through."""
    sent = iter(range(count))
    return lambda: next(sent, None) is None


def test_a_trickling_body_is_a_408_by_the_deadline_and_the_connection_closes(base):
    with _raw(base) as sock:
        started = time.monotonic()  # before the server can see the request: its deadline starts later
        sock.sendall(_upload_head(10_000) + f"--{BOUNDARY}\r\n".encode())
        answer = b""
        _trickle(sock, every_s=0.2, stop=_stop_after(40))  # for longer than the deadline
        answer = _read_all(sock, 8)
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"code":"body_timeout"' in answer and b"--body_timeout" in answer
    assert answer.endswith(b"<closed>")  # the rest of the trickle is never read
    assert BODY_TIMEOUT_S <= elapsed < BODY_TIMEOUT_S + 3, elapsed


def test_a_client_that_leaves_mid_upload_is_one_log_line(base, records):
    before = len(records.lines)
    with _raw(base) as sock:
        sock.sendall(_upload_head(50_000) + f"--{BOUNDARY}\r\n".encode() + b"x" * 1000)
        time.sleep(0.2)
    deadline = time.monotonic() + 10
    while len(records.lines) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # anything else it would log
    new = records.lines[before:]
    assert len(new) == 1 and "closed the connection before its request was read" in new[0], new
    assert httpx.get(f"{base}/health").status_code == 200


def test_the_schema_needs_the_key_and_describes_the_audio_form(base):
    assert httpx.get(f"{base}/openapi.json").status_code == 401
    assert httpx.get(f"{base}/openapi.json", headers={"Authorization": "Bearer wrong"}).status_code == 401
    for docs in ("/docs", "/redoc"):
        assert httpx.get(f"{base}{docs}", headers=AUTH).status_code == 404
    schema = httpx.get(f"{base}/openapi.json", headers=AUTH).json()
    form = schema["paths"]["/v1/audio/transcriptions"]["post"]["requestBody"]["content"][
        "multipart/form-data"
    ]
    assert form["schema"]["required"] == ["file", "model"]
    assert {"file", "model", "beam_size", "timestamp_granularities[]"} <= set(form["schema"]["properties"])


def test_a_trailing_slash_is_a_404_not_a_redirect_built_from_host(base):
    for path in ("/v1/models/", "/health/", "/v1/audio/transcriptions/"):
        response = httpx.get(f"{base}{path}", headers={**AUTH, "Host": "attacker.example"})
        assert response.status_code == 404, path
        assert "location" not in response.headers and "attacker" not in response.text


def test_once_shutdown_begins_a_body_still_being_read_is_a_503_at_once(records):
    from whisperkv.serve import ServeSettings, create_app

    settings = ServeSettings(api_key=API_KEY, body_timeout_s=60)
    app = create_app(EnglishModel(), StandInScheduler(), settings)
    server, thread, port = _serve(app)
    try:
        with _raw(f"http://127.0.0.1:{port}") as sock:
            sock.sendall(_upload_head(10_000_000) + f"--{BOUNDARY}\r\n".encode() + b"x" * 100)
            time.sleep(0.3)
            started = time.monotonic()
            app.state.lifecycle.begin_shutdown()  # what the first SIGTERM does
            answer = _read_all(sock, 10)
            elapsed = time.monotonic() - started
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert answer.startswith(b"HTTP/1.1 503") and b"shutting_down" in answer, answer[:300]
    assert answer.endswith(b"<closed>") and elapsed < 3, elapsed


def test_without_a_key_the_schema_is_open(records):
    from whisperkv.serve import ServeSettings, create_app

    server, thread, port = _serve(create_app(EnglishModel(), StandInScheduler(), ServeSettings()))
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/openapi.json").json()["info"]["title"] == "whisperkv"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


# ---------------------------------------------------------------- the commands themselves


def _env() -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("WHISPERKV_API_KEY", None)
    return env


def _one_error_line(capsys, argv: list[str], *words: str) -> None:
    """``whisperkv ARGV`` (in this process) exits 2 with one ``whisperkv: error:`` line naming ``words``."""
    from whisperkv.cli import main

    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        status = exit_.code
    out, err = capsys.readouterr()
    assert status == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("whisperkv: error: "), err
    assert all(w in lines[0] for w in words), lines[0]


@pytest.fixture
def secret_file(tmp_path) -> str:
    path = tmp_path / "secret"
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return str(path)


@pytest.mark.parametrize("command", ["serve", "encoder-worker"])
def test_a_bad_or_busy_port_is_one_error_line_before_the_model_loads(command, secret_file, capsys):
    extra = ["--secret_file", secret_file] if command == "encoder-worker" else []
    # a model path that does not exist: had it been loaded first, the error would name it
    model = ["--model", "/nonexistent/weights.safetensors", *extra]
    _one_error_line(capsys, [command, "--port", "99999", *model], "--port", "99999")
    _one_error_line(capsys, [command, "--port", "-1", *model], "--port")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        _one_error_line(capsys, [command, "--port", port, *model], port, "already in use")
    _one_error_line(capsys, [command, "--host", "no-such-host.invalid", "--port", "0", *model], "resolve")


@pytest.mark.slow
def test_sigterm_with_a_trickling_upload_answers_it_503_and_exits_at_once(tmp_path):
    """``whisperkv serve --port 0`` says where it listens; SIGTERM during a trickling upload answers it 503
    and exits 0 within seconds (uvicorn alone waited for the trickle: over 90 s)."""
    log = open(tmp_path / "serve.log", "w+")
    server = subprocess.Popen(
        [sys.executable, "-m", "whisperkv", "serve", "--port", "0", "--api_key", API_KEY],
        env=_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while "listening on http://" not in (text := (tmp_path / "serve.log").read_text()):
            assert server.poll() is None and time.monotonic() < deadline, text
            time.sleep(0.1)
        base = text.split("listening on ")[1].split()[0]
        while True:
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with _raw(base) as sock:
            sock.sendall(_upload_head(10_000_000) + f"--{BOUNDARY}\r\n".encode())
            sock.sendall(b"x" * 100)
            server.send_signal(signal.SIGTERM)
            started = time.monotonic()
            stop = threading.Event()

            _trickle(sock, every_s=0.5, stop=stop.is_set)
            answer = _read_all(sock, 20)
            stop.set()
        assert server.wait(timeout=30) == 0
        elapsed = time.monotonic() - started
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
        log.close()
    output = (tmp_path / "serve.log").read_text()
    assert answer.startswith(b"HTTP/1.1 503") and b"shutting_down" in answer, answer[:300]
    assert elapsed < 15, elapsed
    assert "Traceback" not in output, output


def test_the_encoder_worker_serves_on_the_socket_it_bound_and_says_where(secret_file, capsys, monkeypatch):
    """In this process, the model load and uvicorn stood in for: the port is bound first, printed, and
    that listening socket is what the worker is served on."""
    from whisperkv import cli
    from whisperkv.boundary import worker

    served: dict = {}

    def serve(model, secret, carry, host="127.0.0.1", port=8001, sock=None) -> None:
        served.update(model=model, sock=sock, port=sock.getsockname()[1])
        with socket.create_connection(("127.0.0.1", served["port"]), timeout=5):
            pass  # it listens already

    monkeypatch.setattr(cli, "_load", lambda args: "the model")
    monkeypatch.setattr(worker, "run_worker", serve)
    assert cli.main(["encoder-worker", "--port", "0", "--secret_file", secret_file]) == 0
    err = capsys.readouterr().err
    assert served["model"] == "the model"
    assert f"whisperkv encoder-worker: listening on http://127.0.0.1:{served['port']}" in err, err


@pytest.mark.slow
def test_the_encoder_worker_says_where_it_listens(tmp_path, secret_file):
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "whisperkv",
                "encoder-worker",
                "--port",
                "0",
                "--secret_file",
                secret_file,
            ],
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while "listening on http://" not in (text := log.read_text()):
            assert worker.poll() is None and time.monotonic() < deadline, text
            time.sleep(0.1)
        host, port = text.split("listening on http://")[1].split()[0].rsplit(":", 1)
        while True:  # the port it names is the one it serves on
            try:
                with socket.create_connection((host, int(port)), timeout=5):
                    break
            except OSError:
                assert worker.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
    finally:
        worker.terminate()
        worker.wait(30)
    assert "Traceback" not in log.read_text()
