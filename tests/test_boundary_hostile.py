"""Hostile clients at the trust boundary (issue 41).

Against a real worker on 127.0.0.1: unauthenticated, replayed and stale hellos open nothing, a flood of
them leaves a live session working, sessions are capped (503, never evicting a live one) and expire,
every body is bounded in size and time, malformed JSON and labels are 4xx, a disconnect is one log line.
Start-up: a bad secret file is one ``whisperkv: error:`` line, exit 2, before the model loads. Hostile
workers are tests/test_boundary_hostile_worker.py's.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import torch

from whisperkv.audio import N_FRAMES, N_SAMPLES, load_audio, log_mel_spectrogram, pad_or_trim
from whisperkv.boundary.associated_data import canonical
from whisperkv.boundary.client import RemoteEncoder
from whisperkv.boundary.handshake import ClientHello, client_finish
from whisperkv.boundary.keys import fresh_nonce, measure
from whisperkv.boundary.protocol import request_label
from whisperkv.boundary.worker import background_worker, create_app, max_request_bytes
from whisperkv.cache.store import CacheStore
from whisperkv.errors import SealedCacheError

SECRET = os.urandom(32)


@pytest.fixture(scope="module")
def window(speech_dir, tiny_model):
    """jfk's one 30 s window: (mel, start, end)."""
    audio = load_audio(str(speech_dir / "en" / "jfk.flac"))
    mel = log_mel_spectrogram(audio, tiny_model.dims.n_mels, padding=N_SAMPLES)
    return pad_or_trim(mel[:, :N_FRAMES], N_FRAMES), 0, audio.shape[0]


@contextmanager
def worker(model, **options) -> Iterator[tuple[str, object]]:
    app = create_app(model, SECRET, "features", **options)
    with background_worker(app) as url:
        yield url, app.state.worker


def _hello(model, secret: bytes = SECRET, **changes) -> tuple[ClientHello, dict]:
    hello = ClientHello(os.urandom(16).hex(), fresh_nonce(), measure(model, "features"))
    for name, value in changes.items():
        setattr(hello, name, value)
    return hello, hello.to_json(secret)


def _encode(encoder: RemoteEncoder, model, window) -> None:
    mel, start, end = window
    CacheStore(encoder=encoder).encode(model, mel, start, end)


def test_unauthenticated_hellos_keep_nothing_and_a_live_session_survives(tiny_model, window):
    """600 hellos without the secret during a transcription: all refused, none kept, the session works."""
    with worker(tiny_model, max_sessions=4) as (url, state):
        with RemoteEncoder(url, SECRET) as live, httpx.Client(trust_env=False, timeout=30) as client:
            _encode(live, tiny_model, window)  # the live session's first window
            statuses = []
            for _ in range(200):
                _, untagged = _hello(tiny_model)
                del untagged["tag"]
                _, wrong_secret = _hello(tiny_model, os.urandom(32))
                _, forged = _hello(tiny_model)
                forged["tag"] = os.urandom(32).hex()
                for body in (untagged, wrong_secret, forged):
                    statuses.append(client.post(url + "/v1/session", json=body).status_code)
            assert len(statuses) == 600 and set(statuses) <= {400, 403}, set(statuses)
            assert statuses.count(403) == 400  # the wrong secret's and the forged tags: 403
            assert len(state.sessions) == 1  # only the live one
            mel, start, end = window
            served = CacheStore(encoder=live).encode(tiny_model, mel, start, end)  # still served, exactly
            assert torch.equal(served.audio_features, tiny_model.embed_audio(mel.unsqueeze(0)))


def test_replayed_and_stale_hellos_are_refused(tiny_model):
    with worker(tiny_model) as (url, state), httpx.Client(trust_env=False, timeout=30) as client:
        hello, body = _hello(tiny_model)
        first = client.post(url + "/v1/session", json=body)
        assert first.status_code == 200 and client_finish(SECRET, hello, first.json())
        again = client.post(url + "/v1/session", json=body)  # recorded and sent again
        assert again.status_code == 403 and "replayed hello" in again.json()["error"]
        _, stale = _hello(tiny_model, issued_at=int(time.time()) - 1000)
        refused = client.post(url + "/v1/session", json=stale)
        assert (
            refused.status_code == 403 and "s from the worker's clock (over 300 s)" in refused.json()["error"]
        )
        assert len(state.sessions) == 1


def test_sessions_are_capped_without_evicting_live_ones_and_expire(tiny_model, window):
    with worker(tiny_model, max_sessions=2) as (url, state):
        first, second, third = (RemoteEncoder(url, SECRET) for _ in range(3))
        _encode(first, tiny_model, window)
        _encode(second, tiny_model, window)
        with pytest.raises(SealedCacheError, match="status 503: the worker holds its maximum of 2 sessions"):
            _encode(third, tiny_model, window)
        first.close()  # frees its slot at the worker
        assert len(state.sessions) == 1
        _encode(third, tiny_model, window)
        second.close(), third.close()
        assert len(state.sessions) == 0
    with worker(tiny_model, session_idle_s=0.3) as (url, state):
        with RemoteEncoder(url, SECRET) as idle, httpx.Client(trust_env=False, timeout=30) as client:
            _encode(idle, tiny_model, window)
            expired = idle.request_id
            time.sleep(0.5)
            assert len(state.sessions) == 0  # the worker forgot the session: its old label is a 404
            label = _label_bytes(tiny_model, window, expired, seq=99)
            answer = client.post(url + "/v1/encode", content=_blob(label))
            assert answer.status_code == 404 and "idle over 0.3 s" in answer.json()["error"]


def test_every_route_bounds_its_body(tiny_model):
    limit = max_request_bytes(tiny_model)
    assert limit < 1_000_000  # tiny.en's window is 960,000 bytes of float32 log-Mel
    with worker(tiny_model) as (url, state), httpx.Client(trust_env=False, timeout=30) as client:
        for path, size in [("/v1/session", 200_000), ("/v1/session/close", 5000), ("/v1/encode", limit + 1)]:
            answer = client.post(url + path, content=bytes(size))
            assert answer.status_code == 413 and "request over" in answer.json()["error"], path

            def chunks(size=size):  # no content-length: the worker stops reading at its limit
                for _ in range(size // 4096 + 1):
                    yield bytes(4096)

            streamed = client.post(url + path, content=chunks())
            assert streamed.status_code == 413, path
        assert len(state.sessions) == 0


def _raw_request(port: int, path: str, head_only: bytes, length: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {length}\r\n\r\n".encode() + head_only
    )
    return sock


def _whole_answer(sock: socket.socket) -> str:
    """An HTTP answer read to the end of its body (its head and body may come in separate segments)."""
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _content_length(data):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode()


def _content_length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_trickle_is_cut_off_and_a_disconnect_is_one_log_line(tiny_model):
    with worker(tiny_model, body_deadline_s=0.5) as (url, state):
        port = int(url.rsplit(":", 1)[1])
        records = _Records()
        loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.error", "whisperkv.boundary.worker")]
        for lg in loggers:
            lg.addHandler(records)
        try:
            start = time.monotonic()
            sock = _raw_request(port, "/v1/encode", b"WKVS", 100_000)  # four bytes, then nothing
            answer = _whole_answer(sock)
            sock.close()
            assert answer.startswith("HTTP/1.1 408") and "not received within 0.5 s" in answer
            assert time.monotonic() - start < 5
            for path in ["/v1/encode"] * 8 + ["/v1/session"] * 2:  # stalled uploads, then gone
                _raw_request(port, path, b"x" * 100, 3000).close()
            deadline = time.monotonic() + 10
            gone = []
            while time.monotonic() < deadline and len(gone) < 10:
                gone = [r for r in records.records if "disconnected during" in r.getMessage()]
                time.sleep(0.05)
        finally:
            for lg in loggers:
                lg.removeHandler(records)
        assert len(gone) == 10 and {r.levelno for r in gone} == {logging.WARNING}
        assert not [r for r in records.records if r.exc_info or "Exception" in r.getMessage()]
        assert httpx.get(url + "/healthz", trust_env=False).status_code == 200


def _label_bytes(model, window, request_id: str, **changes) -> bytes:
    mel, start, end = window
    record = json.loads(
        request_label(model, model.encoder_provenance(mel, start, end), request_id, 0).encode()
    )
    record["shape"] = list(record["shape"])
    return canonical({**record, **changes})


def _blob(label: bytes, ciphertext: bytes = b"\0" * 32) -> bytes:
    n = len(label).to_bytes(4, "big")
    return b"WKVS\x01\x00\x01" + n + label + len(ciphertext).to_bytes(4, "big") + ciphertext


def test_malformed_json_labels_and_sequence_numbers_are_4xx(tiny_model, window):
    """Deep nesting in a hello or a label, seq -1 and 2**64 after a real handshake: 400, never a 500."""
    with worker(tiny_model) as (url, state), httpx.Client(trust_env=False, timeout=30) as client:
        hello, body = _hello(tiny_model)
        assert client.post(url + "/v1/session", json=body).status_code == 200
        for hostile in [b"[" * 4000, b'{"a":' * 600 + b"1" + b"}" * 600, b"1" * 4000, b"\xff\xfe", b"null"]:
            answer = client.post(url + "/v1/session", content=hostile)
            assert answer.status_code == 400 and "bad handshake" in answer.json()["error"], hostile[:20]
        rid = hello.request_id
        for label in [
            _label_bytes(tiny_model, window, rid, seq=-1),
            _label_bytes(tiny_model, window, rid, seq=2**64),
            _label_bytes(tiny_model, window, rid, layer=2**40),
            _label_bytes(tiny_model, window, rid, shape=[[[[1]]]]),
            b"[" * 1500 + b"]" * 1500,
            b"[" * 3000,
        ]:
            answer = client.post(url + "/v1/encode", content=_blob(label))
            assert answer.status_code == 400 and "malformed blob" in answer.json()["error"], label[:40]
        wrong_shape = _label_bytes(tiny_model, window, rid, shape=[1, 80, 10])
        answer = client.post(url + "/v1/encode", content=_blob(wrong_shape))
        assert answer.status_code == 400 and "field 'shape'" in answer.json()["error"]
        for close in [
            b"[" * 900,
            b'{"request_id": 1, "tag": 2}',
            json.dumps({"request_id": rid, "tag": "00"}),
        ]:
            answer = client.post(url + "/v1/session/close", content=close)
            assert answer.status_code in (400, 403, 404), close[:20]
        assert len(state.sessions) == 1  # a close with a wrong tag closed nothing


def _secret_file(path, data: bytes, mode: int):
    path.write_bytes(data)
    path.chmod(mode)
    return str(path)


def test_a_bad_secret_file_is_one_line_and_exit_2_before_the_model_loads(
    tmp_path, speech_dir, monkeypatch, capsys
):
    from whisperkv import cli

    def no_load(args):
        raise AssertionError("the model was loaded before the secret was checked")

    monkeypatch.setattr(cli, "_load", no_load)
    bad = {
        "world-readable": (
            os.urandom(32),
            0o644,
            "accessible to group or others (mode 644); make it private",
        ),
        "short": (os.urandom(20), 0o600, "20 bytes; the secret is exactly 32 random bytes"),
        "passphrase": (b"hunter2 is my passphrase!\n", 0o600, "holds text (25 characters, a passphrase?)"),
    }
    for name, (data, mode, message) in bad.items():
        path = _secret_file(tmp_path / name, data, mode)
        for argv in (
            ["encoder-worker", "--secret_file", path, "--port", "8001"],
            [
                "transcribe",
                str(speech_dir / "en" / "jfk.flac"),
                "--encoder_url",
                "http://127.0.0.1:9",
                "--secret_file",
                path,
            ],
        ):
            assert cli.main(argv) == 2, (name, argv[0])
            captured = capsys.readouterr()
            lines = captured.err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("whisperkv: error: secret file "), captured.err
            assert message in lines[0], lines[0]
    missing = str(tmp_path / "missing")
    assert cli.main(["encoder-worker", "--secret_file", missing]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"whisperkv: error: secret file {missing}: No such file or directory"
    )
