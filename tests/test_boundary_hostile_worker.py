"""Hostile workers at the trust boundary (issue 41); the client side is tests/test_boundary_hostile.py's.

Against a hostile "worker" (a small server that answers badly, forwarding the handshake to a real worker
where a test needs one): every bad answer is a SealedCacheError — oversized, endless, trickled,
non-object errors, deeply nested JSON — within its deadline, and the deadline holds when the last byte
comes just before it. A session the worker expired is opened again once and its window served exactly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import torch

from tests import test_boundary_hostile
from tests.test_boundary_hostile import SECRET, _blob, _encode, worker
from whisperkv.boundary.client import RemoteEncoder
from whisperkv.cache.store import CacheStore
from whisperkv.errors import SealedCacheError

# test_boundary_hostile.py's module fixture (jfk's one window), seen by pytest under its own name here;
# bound by assignment so a test's argument does not read as a redefinition of an import
window = test_boundary_hostile.window


def _no_session(path: str, h: _HostileHandler) -> None:
    h._send(404, b'{"error": "no session for request id"}')


def test_an_expired_session_is_opened_again_once_and_the_window_served_exactly(tiny_model, window):
    """A worker whose sessions live 60 s idle (its clock moved on by hand, so the machine's load cannot
    expire a session early): the decoder's next window after 61 s runs one new handshake and is served
    exactly (the local encoder's bits); a worker that keeps answering 404 for the new session too gets
    exactly one new handshake, then the 404 is the decoder's error."""
    mel, start, end = window
    local = tiny_model.embed_audio(mel.unsqueeze(0))
    now = [0.0]
    with worker(tiny_model, session_idle_s=60) as (url, state), RemoteEncoder(url, SECRET) as encoder:
        state.sessions.clock = lambda: now[0]
        first = CacheStore(encoder=encoder).encode(tiny_model, mel, start, end)
        old_id = encoder.request_id
        now[0] += 61
        assert len(state.sessions) == 0  # expired at the worker
        again = CacheStore(encoder=encoder).encode(tiny_model, mel, start, end)
        assert encoder.handshakes == 2 and encoder.request_id != old_id
        assert torch.equal(first.audio_features, local) and torch.equal(again.audio_features, local)
        assert len(state.sessions) == 1
        CacheStore(encoder=encoder).encode(tiny_model, mel, start, end)  # the new session serves on
        assert encoder.handshakes == 2
    with worker(tiny_model) as (real, _):
        with hostile(_no_session, real) as url, RemoteEncoder(url, SECRET) as encoder:
            with pytest.raises(SealedCacheError, match="status 404: no session") as err:
                _encode(encoder, tiny_model, window)
            assert err.value.field == "session" and encoder.handshakes == 2


class _HostileWorker(ThreadingHTTPServer):
    """Answers every POST with ``answer(path, handler)``; forwards the handshake to ``real`` if given."""

    daemon_threads = True

    def __init__(self, answer: Callable, real: str | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _HostileHandler)
        self.answer, self.real = answer, real

    def handle_error(self, request, client_address) -> None:
        pass  # a decoder that stopped reading resets the connection: expected here


class _HostileHandler(BaseHTTPRequestHandler):
    server: _HostileWorker
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        try:
            if self.server.real and self.path.startswith("/v1/session"):
                real = httpx.post(self.server.real + self.path, content=body, trust_env=False, timeout=30)
                self._send(real.status_code, real.content)
            else:
                self.server.answer(self.path, self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the decoder stopped reading: what the test wants

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@contextmanager
def hostile(answer: Callable, real: str | None = None) -> Iterator[str]:
    server = _HostileWorker(answer, real)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _endless(path: str, h: _HostileHandler) -> None:
    h.send_response(200)
    h.send_header("transfer-encoding", "chunked")
    h.end_headers()
    for _ in range(20_000):  # 1.3 GB if nobody stopped reading
        h.wfile.write(b"10000\r\n" + bytes(65536) + b"\r\n")


def _trickle(path: str, h: _HostileHandler) -> None:
    h.send_response(200)
    h.send_header("content-length", "2304403")
    h.end_headers()
    for _ in range(200):
        h.wfile.write(b"W")
        h.wfile.flush()
        time.sleep(0.05)


def test_hostile_worker_answers_are_sealed_cache_errors(tiny_model, window):
    """Every bad answer is a SealedCacheError naming it; the endless one is cut at the expected size."""
    cases = [
        (lambda p, h: h._send(400, b"[1, 2]"), "status 400: \\[1, 2\\]"),  # a non-object JSON error body
        (lambda p, h: h._send(500, b'{"error": {"nested": 1}}'), "status 500"),
        (lambda p, h: h._send(200, b"[" * 4000), "handshake answer is not JSON"),  # deep nesting
        (lambda p, h: h._send(200, b'{"a":' * 800), "handshake answer is not JSON"),
        (lambda p, h: h._send(200, b"x" * 100_000), "answer to /v1/session declares 100000 bytes"),
        (lambda p, h: h._send(200, b'"just a string"'), "handshake answer is not a JSON object"),
        (lambda p, h: h._send(200, b'{"confirm": 5, "worker_nonce": []}'), "handshake answer is malformed"),
    ]
    for answer, match in cases:
        with hostile(answer) as url, RemoteEncoder(url, SECRET) as encoder:
            with pytest.raises(SealedCacheError, match=match):
                _encode(encoder, tiny_model, window)
    with worker(tiny_model) as (real, _):
        with hostile(lambda p, h: _endless(p, h), real) as url, RemoteEncoder(url, SECRET) as encoder:
            with pytest.raises(SealedCacheError, match="answer to /v1/encode is over") as err:
                _encode(encoder, tiny_model, window)
            assert err.value.field == "size"
            cap = int(err.value.reason.split(" is over ")[1].split()[0])
            assert 1500 * 384 * 4 < cap < 1500 * 384 * 4 + 5000  # the encoder output, its label, a slack
        with hostile(_trickle, real) as url, RemoteEncoder(url, SECRET, deadline=1.0) as encoder:
            start = time.monotonic()
            with pytest.raises(SealedCacheError, match="no complete answer to /v1/encode within 1 s"):
                _encode(encoder, tiny_model, window)
            assert time.monotonic() - start < 3
        nested = _blob(b"[" * 1500 + b"]" * 1500)
        with hostile(lambda p, h: h._send(200, nested), real) as url, RemoteEncoder(url, SECRET) as encoder:
            with pytest.raises(SealedCacheError, match="malformed blob: associated data"):
                _encode(encoder, tiny_model, window)


def _one_byte_then_silence(path: str, h: _HostileHandler) -> None:
    time.sleep(1.8)  # the head and one byte just before the 2 s deadline, then nothing for 6 s
    h.send_response(200)
    h.send_header("content-length", "2304403")
    h.end_headers()
    h.wfile.write(b"W")
    h.wfile.flush()
    time.sleep(6)


def test_the_deadline_holds_when_the_last_byte_comes_just_before_it(tiny_model, window):
    """The decoder's deadline bounds the whole exchange, not the time between chunks: a worker that sends
    one byte at 1.8 s of a 2 s deadline and then nothing is cut off at 2 s (the call returns within the
    deadline plus a thread's wake-up; it took 3.8 s, the deadline plus one more read timeout, when the
    deadline was checked only between chunks)."""
    with worker(tiny_model) as (real, _), hostile(_one_byte_then_silence, real) as url:
        with RemoteEncoder(url, SECRET, deadline=2.0) as encoder:
            encoder._session(tiny_model)  # the handshake first, so only the window's exchange is timed
            start = time.monotonic()
            with pytest.raises(SealedCacheError, match="no complete answer to /v1/encode within 2 s") as err:
                _encode(encoder, tiny_model, window)
            elapsed = time.monotonic() - start
    assert err.value.field == "deadline"
    assert 1.9 < elapsed < 2.6, elapsed
