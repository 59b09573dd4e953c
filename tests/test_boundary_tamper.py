"""An intermediary between decoder and encoder worker tampers with what crosses (issue 11).

A small HTTP proxy on 127.0.0.1 sits between ``RemoteEncoder`` and a worker and flips a byte,
truncates, swaps two responses' bodies, replays a body from an earlier session or window, or
forwards to a worker with other weights or another secret. Each is refused with a SealedCacheError
naming the reason, and no transcript comes back.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
import torch

from whisperkv.audio import N_FRAMES, N_SAMPLES, load_audio, log_mel_spectrogram, pad_or_trim
from whisperkv.boundary.associated_data import PartLabel
from whisperkv.boundary.client import RemoteEncoder
from whisperkv.boundary.worker import background_worker, create_app
from whisperkv.cache.store import CacheStore
from whisperkv.errors import SealedCacheError

SECRET = os.urandom(32)  # the shared secret is 32 random bytes
LABEL_FIELDS = {f.name for f in fields(PartLabel)}
Tamper = Callable[[str, int, bytes], bytes]  # (path, index of that path's call, body) -> body


class TamperProxy(ThreadingHTTPServer):
    """Forwards POSTs to ``target``; ``tamper_response`` / ``tamper_request`` may change the bodies."""

    daemon_threads = True

    def __init__(
        self, target: str, tamper_response: Tamper | None = None, tamper_request: Tamper | None = None
    ):
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.target = target
        self.tamper_response = tamper_response
        self.tamper_request = tamper_request
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()
        self.client = httpx.Client(timeout=60, trust_env=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(BaseHTTPRequestHandler):
    server: TamperProxy

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        proxy = self.server
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        with proxy.lock:
            index = proxy.calls.get(self.path, 0)
            proxy.calls[self.path] = index + 1
        if proxy.tamper_request:
            body = proxy.tamper_request(self.path, index, body)
        headers = {"content-type": self.headers.get("content-type", "application/octet-stream")}
        answer = proxy.client.post(proxy.target + self.path, content=body, headers=headers)
        out = answer.content
        if proxy.tamper_response and answer.status_code == 200:
            out = proxy.tamper_response(self.path, index, out)
        self.send_response(answer.status_code)
        for name, value in answer.headers.items():
            if name.lower().startswith("x-whisperkv") or name.lower() == "content-type":
                self.send_header(name, value)
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args) -> None:
        pass


@contextmanager
def proxy_to(target: str, **tamper) -> Iterator[TamperProxy]:
    proxy = TamperProxy(target, **tamper)
    thread = threading.Thread(target=proxy.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
        proxy.client.close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def worker_url(tiny_model) -> Iterator[str]:
    with background_worker(create_app(tiny_model, SECRET, "features")) as url:
        yield url


@pytest.fixture(scope="module")
def jfk_audio(speech_dir) -> np.ndarray:
    return load_audio(str(speech_dir / "en" / "jfk.flac"))


@pytest.fixture(scope="module")
def two_windows(jfk_audio, tiny_model) -> list[tuple[torch.Tensor, int, int]]:
    """Two different 30 s windows (jfk three times is 33 s): (mel, start, end)."""
    audio = np.tile(jfk_audio, 3)
    mel = log_mel_spectrogram(audio, tiny_model.dims.n_mels, padding=N_SAMPLES)
    first = pad_or_trim(mel[:, :N_FRAMES], N_FRAMES)
    rest = audio.shape[0] // 160 - N_FRAMES
    second = pad_or_trim(mel[:, N_FRAMES : N_FRAMES + rest], N_FRAMES)
    return [(first, 0, N_SAMPLES), (second, N_SAMPLES, N_SAMPLES + rest * 160)]


def _refused(model, url: str, audio, match: str, carry: str = "features", secret: bytes = SECRET):
    """Transcribe through ``url``; it must raise SealedCacheError matching ``match`` (and return nothing)."""
    with RemoteEncoder(url, secret, carry=carry) as encoder:
        with pytest.raises(SealedCacheError, match=match) as err:
            model.transcribe(audio, encoder=encoder, verbose=None)
    return err.value


def test_untampered_proxy_passes(tiny_model, worker_url, jfk_audio):
    with proxy_to(worker_url) as proxy:
        with RemoteEncoder(proxy.url, SECRET) as encoder:
            remote = tiny_model.transcribe(jfk_audio, encoder=encoder, verbose=None)
    local = tiny_model.transcribe(jfk_audio, verbose=None)
    assert remote["text"] == local["text"]
    assert proxy.calls == {"/v1/session": 1, "/v1/encode": 1, "/v1/session/close": 1}  # close frees the slot


def test_flipped_byte_anywhere_is_refused(tiny_model, worker_url, jfk_audio):
    """A flip in the blob's header, in a label, or in the ciphertext; and one in the request."""
    for pos, field in [(5, "layout"), (40, None), (-3, "authentication")]:

        def flip(path, index, body, pos=pos):
            return body[:pos] + bytes([body[pos] ^ 0x10]) + body[pos:][1:] if path == "/v1/encode" else body

        with proxy_to(worker_url, tamper_response=flip) as proxy:
            err = _refused(tiny_model, proxy.url, jfk_audio, "refusing sealed cache")
        assert err.field in {"authentication", "layout", "associated data", "parts", *LABEL_FIELDS}, err
        assert field is None or err.field == field, err
    with proxy_to(
        worker_url, tamper_request=lambda p, i, b: b[:-1] + bytes([b[-1] ^ 1]) if p == "/v1/encode" else b
    ) as proxy:
        _refused(
            tiny_model, proxy.url, jfk_audio, "refused /v1/encode with status 403: authentication failed"
        )


def test_truncated_body_is_refused(tiny_model, worker_url, jfk_audio):
    with proxy_to(
        worker_url, tamper_response=lambda p, i, b: b[: len(b) // 2] if p == "/v1/encode" else b
    ) as proxy:
        _refused(tiny_model, proxy.url, jfk_audio, "truncated blob")


def test_replay_from_an_earlier_session_is_refused(tiny_model, worker_url, jfk_audio):
    recorded: list[bytes] = []

    def record(path, index, body):
        if path == "/v1/encode":
            recorded.append(body)
        return body

    with proxy_to(worker_url, tamper_response=record) as proxy:
        with RemoteEncoder(proxy.url, SECRET) as encoder:
            tiny_model.transcribe(jfk_audio, encoder=encoder, verbose=None)
    assert len(recorded) == 1
    with proxy_to(
        worker_url, tamper_response=lambda p, i, b: recorded[0] if p == "/v1/encode" else b
    ) as proxy:
        err = _refused(tiny_model, proxy.url, jfk_audio, "blob from another request: .*'request_id'")
    assert err.field == "request_id"


def test_replay_of_an_earlier_window_is_refused(tiny_model, worker_url, two_windows):
    bodies: list[bytes] = []

    def replay_previous(path, index, body):
        if path != "/v1/encode":
            return body
        bodies.append(body)
        return bodies[0]  # every window gets the first window's answer

    with (
        proxy_to(worker_url, tamper_response=replay_previous) as proxy,
        RemoteEncoder(proxy.url, SECRET) as enc,
    ):
        store = CacheStore(encoder=enc)
        (mel1, s1, e1), (mel2, s2, e2) = two_windows
        first = store.encode(tiny_model, mel1, s1, e1)
        assert first.provenance.window_start == 0
        with pytest.raises(SealedCacheError, match="replayed or reordered blob: .*'seq' differs") as err:
            store.encode(tiny_model, mel2, s2, e2)
        assert err.value.field == "seq"


def test_swapped_bodies_of_two_responses_are_refused(tiny_model, worker_url, two_windows):
    """Two requests in flight at once; the proxy hands each the other's answer."""
    barrier = threading.Barrier(2, timeout=60)
    slots: dict[int, bytes] = {}

    def swap(path, index, body):
        if path != "/v1/encode":
            return body
        slots[index] = body
        barrier.wait()
        return slots[1 - index]

    errors: list[BaseException | None] = [None, None]
    with proxy_to(worker_url, tamper_response=swap) as proxy:

        def run(i: int) -> None:
            mel, start, end = two_windows[i]
            try:
                with RemoteEncoder(proxy.url, SECRET) as enc:
                    CacheStore(encoder=enc).encode(tiny_model, mel, start, end)
            except BaseException as err:  # noqa: BLE001 - collected and checked below
                errors[i] = err

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert all(isinstance(e, SealedCacheError) and e.field == "request_id" for e in errors), errors


@pytest.fixture(scope="module")
def other_weights_model(tiny_model):
    """tiny.en with one encoder weight changed (an in-process copy: quicker than convert + load)."""
    model = copy.deepcopy(tiny_model)
    model.__dict__.pop("weights_digest", None)
    with torch.no_grad():
        model.encoder.conv1.weight[0, 0, 0] += 1e-3
    assert model.weights_digest != tiny_model.weights_digest
    return model


def test_worker_with_other_weights_is_refused(tiny_model, other_weights_model, jfk_audio):
    with background_worker(create_app(other_weights_model, SECRET, "features")) as other:
        with proxy_to(other) as proxy:  # the worker says what it runs
            err = _refused(tiny_model, proxy.url, jfk_audio, "worker measurement 'weights_digest' differs")
        assert err.field == "weights_digest"

        def lie(path, index, body):  # the intermediary claims our weights for it
            if path != "/v1/session":
                return body
            import json

            answer = json.loads(body)
            answer["measurement"]["weights_digest"] = tiny_model.weights_digest
            return json.dumps(answer).encode()

        with proxy_to(other, tamper_response=lie) as proxy:
            _refused(tiny_model, proxy.url, jfk_audio, "key confirmation failed")


def test_worker_with_another_secret_is_refused(tiny_model, worker_url, jfk_audio):
    # the worker refuses the hello itself: it keeps nothing for a decoder without its secret
    _refused(
        tiny_model, worker_url, jfk_audio, "status 403: .*hello's tag does not verify", secret=os.urandom(32)
    )


def test_worker_of_the_other_carry_mode_is_refused(tiny_model, worker_url, jfk_audio):
    _refused(tiny_model, worker_url, jfk_audio, "worker measurement 'carry' differs", carry="cross_kv")


def test_worker_refuses_replayed_requests_and_garbage(tiny_model, worker_url, two_windows):
    sent: list[bytes] = []

    def keep(path, index, body):
        if path == "/v1/encode":
            sent.append(body)
        return body

    with httpx.Client(trust_env=False, timeout=60) as client:
        with proxy_to(worker_url, tamper_request=keep) as proxy, RemoteEncoder(proxy.url, SECRET) as enc:
            mel, start, end = two_windows[0]
            CacheStore(encoder=enc).encode(tiny_model, mel, start, end)
            again = client.post(worker_url + "/v1/encode", content=sent[0])  # while the session is open
            assert again.status_code == 409 and "replayed or reordered request" in again.json()["error"]
        closed = client.post(worker_url + "/v1/encode", content=sent[0])  # the encoder closed its session
        assert closed.status_code == 404 and "no session for request id" in closed.json()["error"]
        garbage = client.post(worker_url + "/v1/encode", content=b"hello")
        assert garbage.status_code == 400 and "malformed blob" in garbage.json()["error"]
        huge = client.post(worker_url + "/v1/encode", content=bytes(9 * 2**20))
        assert huge.status_code == 413 and "request over" in huge.json()["error"]
        bad_hello = client.post(worker_url + "/v1/session", content=b"{")
        assert bad_hello.status_code == 400 and "bad handshake" in bad_hello.json()["error"]
