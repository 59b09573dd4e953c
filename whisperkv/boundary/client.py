"""The decoder's side of the boundary: ``RemoteEncoder`` asks a worker to encode a window, sealed.

It plugs into ``CacheStore`` like the local encoder. On first use it runs the handshake (one session,
one request id, one key), then for each window: seal the exact log-Mel window under its label, POST it,
check the labels of what comes back against the ones it expects, open every part, and only then build
the encoder output or the ``CrossKV`` objects, carrying the provenance it just verified. Anything else —
an error status, a malformed, altered, truncated, swapped or replayed blob — is a ``SealedCacheError``.

A worker forgets a session that sat idle past its lifetime (or when it restarts) and answers 404 for it:
the encoder then runs a new handshake, once, and sends the window again under the new session's key (a
fresh request id and key; nothing of the old session is reused). Each exchange runs in a thread of its
own while the caller waits at most its deadline, so a worker that trickles its answer cannot hold the
caller past the deadline (a read blocked in the socket would otherwise wait one more read timeout).
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING

import httpx
import torch

from whisperkv.boundary.costs import WindowCosts, stopwatch
from whisperkv.boundary.handshake import ClientHello, client_finish, close_tag
from whisperkv.boundary.keys import DIRECTION_REQUEST, DIRECTION_RESPONSE, check_secret, fresh_nonce, measure
from whisperkv.boundary.protocol import request_label, response_labels
from whisperkv.boundary.replay import DecoderSequence
from whisperkv.boundary.sealing import open_sealed, seal, sealed_size, tensor_bytes, tensor_from_bytes
from whisperkv.cache.kv import CrossKV
from whisperkv.cache.provenance import CrossKVProvenance, EncoderProvenance
from whisperkv.cache.store import EncodedWindow
from whisperkv.errors import SealedCacheError

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper

#: worker cost headers (milliseconds; informative only, never trusted for a decision)
COST_HEADERS = ("open", "encoder", "projection", "seal")
MAX_ANSWER_BYTES = 4096  # a handshake answer is about 400 bytes
#: an answer may exceed its exact expected size by this much (labels of another window differ in length)
#: and still be read, so that a swapped or replayed answer is refused by the label field that differs
LABEL_SLACK_BYTES = 4096
MAX_ERROR_BYTES = 65536  # an error answer's body is read up to this, then cut
CLOSE_TIMEOUT_S = 2.0


class RemoteEncoder:
    """Encode windows on a worker at ``url`` (``http://127.0.0.1:8001``), sealed with ``secret``.

    ``secret`` is the 32 random bytes the worker holds (``keys.read_secret``). ``timeout`` bounds each
    network operation; ``deadline`` (default: ``timeout``) bounds a whole exchange — a window's answer, or
    the handshake — so a worker that trickles its answer is cut off. An answer is read up to the exact
    size its expected shapes give, never more.
    """

    def __init__(
        self,
        url: str,
        secret: bytes,
        carry: str = "features",
        timeout: float = 120.0,
        client: httpx.Client | None = None,
        deadline: float | None = None,
    ) -> None:
        if carry not in ("features", "cross_kv"):
            raise ValueError(f"unknown carry mode {carry!r}: features or cross_kv")
        self.url = url.rstrip("/")
        self.secret = check_secret(secret, "the RemoteEncoder secret")
        self.carry = carry
        self.timeout = timeout
        self.deadline = timeout if deadline is None else deadline
        self.client = client or httpx.Client(timeout=timeout, trust_env=False)
        self.request_id = ""
        self.handshakes = 0  # sessions opened: one, plus one per session the worker expired
        self._key: bytes | None = None
        self._weights_digest = ""
        self._sequence = DecoderSequence()
        self._lock = threading.Lock()

    def _post(
        self, path: str, limit: int, deadline: float | None = None, **kwargs
    ) -> tuple[httpx.Headers, bytes]:
        """POST and read the answer: at most ``limit`` bytes, whole within ``deadline`` seconds.

        The exchange runs in a thread of its own and the caller waits at most ``deadline`` for it: the
        call returns (or raises) within the deadline plus a thread's wake-up, whatever the worker does.
        An exchange left behind stops at its next chunk or read timeout (at most ``min(timeout,
        deadline)`` later), holding no more than ``limit`` bytes meanwhile.
        """
        deadline = self.deadline if deadline is None else deadline
        answer: Future = Future()
        abandoned = threading.Event()

        def exchange() -> None:
            try:
                answer.set_result(self._exchange(path, limit, deadline, abandoned, **kwargs))
            except BaseException as err:  # noqa: BLE001 - handed to the waiting caller as it is
                answer.set_exception(err)

        threading.Thread(target=exchange, name="whisperkv-remote-encoder", daemon=True).start()
        try:
            return answer.result(timeout=deadline)
        except FutureTimeout:
            abandoned.set()
            late = f"no complete answer to {path} within {deadline:g} s"
            raise SealedCacheError(late, "deadline") from None

    def _exchange(
        self, path: str, limit: int, deadline: float, abandoned: threading.Event, **kwargs
    ) -> tuple[httpx.Headers, bytes]:
        """One POST, its body read as it streams (no content coding), so an oversized or endless answer
        stops at the limit; anything but a 200 is a SealedCacheError carrying the worker's error text
        (field "session" for a window whose session the worker no longer holds)."""
        ends = time.monotonic() + deadline
        headers = {**kwargs.pop("headers", {}), "accept-encoding": "identity"}
        timeout = httpx.Timeout(min(self.timeout, deadline))
        try:
            with self.client.stream(
                "POST", self.url + path, headers=headers, timeout=timeout, **kwargs
            ) as response:
                ok = response.status_code == 200
                limit = limit if ok else MAX_ERROR_BYTES
                body = _read_capped(response, limit, ends, deadline, path, ok, abandoned)
        except httpx.HTTPError as err:
            raise SealedCacheError(f"encoder worker {self.url} unreachable: {err}", "transport") from None
        if not ok:
            gone = response.status_code == 404 and path == "/v1/encode"
            raise SealedCacheError(
                f"encoder worker refused {path} with status {response.status_code}: {_error_detail(body)}",
                "session" if gone else "worker",
            )
        return response.headers, body

    def _session(self, model: Whisper) -> tuple[bytes, str]:
        """The session key for ``model`` and its request id, after a handshake the first time."""
        with self._lock:
            if self._weights_digest and model.weights_digest != self._weights_digest:
                raise ValueError("a RemoteEncoder session serves one model; make another for other weights")
            if self._key is not None:
                return self._key, self.request_id
            hello = ClientHello(secrets.token_hex(16), fresh_nonce(), measure(model, self.carry))
            _, body = self._post("/v1/session", MAX_ANSWER_BYTES, json=hello.to_json(self.secret))
            try:
                answer = json.loads(body)
            except (ValueError, RecursionError):
                raise SealedCacheError("handshake answer is not JSON", "handshake") from None
            self._key = client_finish(self.secret, hello, answer)
            self.request_id = hello.request_id
            self._weights_digest = model.weights_digest
            self.handshakes += 1
            return self._key, self.request_id

    def _forget(self, key: bytes) -> None:
        """The worker no longer holds the session of ``key``: the next window starts a new one (unless
        another thread already did)."""
        with self._lock:
            if self._key is key:
                self._key = None

    def encode(
        self, model: Whisper, mel: torch.Tensor, provenance: EncoderProvenance, reason: str = ""
    ) -> EncodedWindow:
        """One window encoded remotely; ``mel`` [1, n_mels, 3000] is the window ``provenance`` names."""
        if self.carry == "cross_kv" and reason == "language detection":
            raise ValueError(
                "language detection needs the encoder output, which --carry cross_kv does not bring back: "
                "pass --language, or use --carry features"
            )
        for attempt in range(2):
            key, request_id = self._session(model)
            try:
                return self._encode_in(model, mel, provenance, key, request_id)
            except SealedCacheError as err:
                if err.field != "session" or attempt:
                    raise
                self._forget(key)  # expired at the worker: one new handshake, then the window again
        raise AssertionError("unreachable")

    def _encode_in(
        self, model: Whisper, mel: torch.Tensor, provenance: EncoderProvenance, key: bytes, request_id: str
    ) -> EncodedWindow:
        """One window through the session of ``key``."""
        seq = self._sequence.issue()
        asked = request_label(model, provenance, request_id, seq)
        costs = WindowCosts(provenance.window_start, provenance.window_end, self.carry)
        with stopwatch() as seal_ms:
            body = seal(key, DIRECTION_REQUEST, [asked], [tensor_bytes(mel)])
        expected = response_labels(model, asked, self.carry)
        with stopwatch() as round_trip_ms:
            headers, blob = self._post(
                "/v1/encode",
                sealed_size(expected) + LABEL_SLACK_BYTES,
                content=body,
                headers={"content-type": "application/octet-stream"},
            )
        worker = {name: _header_ms(headers, name) for name in COST_HEADERS}
        with stopwatch() as open_ms:
            payloads = open_sealed(key, DIRECTION_RESPONSE, blob, expected)
            self._sequence.accept(seq)  # a blob opens once
            tensors = [tensor_from_bytes(p, label).to(model.device) for p, label in zip(payloads, expected)]
        costs.encoder_ms = worker["encoder"]
        costs.seal_ms = seal_ms[0] + worker["seal"]  # the decoder's request and the worker's response
        costs.transfer_ms = max(0.0, round_trip_ms[0] - sum(worker.values()))
        costs.bytes_sent, costs.bytes_received = len(body), len(blob)
        costs.open_ms = (
            open_ms[0] + worker["open"]
        )  # the decoder opening the response, the worker the request
        if self.carry == "features":
            features = tensors[0]
            with stopwatch() as projection_ms:
                cross_kv = model.decoder.project_cross_kv(features, provenance)
            costs.projection_ms = projection_ms[0]
        else:
            features = torch.empty(1, 0, model.dims.n_audio_state, dtype=model.dtype, device=model.device)
            cross_kv = [CrossKV(t[0], t[1], CrossKVProvenance(provenance, i)) for i, t in enumerate(tensors)]
            costs.projection_ms, costs.projection_side = worker["projection"], "worker"
        return EncodedWindow(provenance, features, cross_kv, costs)

    def close(self) -> None:
        """Ask the worker to free this session's slot (best effort, briefly), then close the client."""
        with self._lock:
            key, self._key = self._key, None
        if key is not None:
            record = {"request_id": self.request_id, "tag": close_tag(key, self.request_id).hex()}
            try:
                self._post("/v1/session/close", MAX_ANSWER_BYTES, CLOSE_TIMEOUT_S, json=record)
            except SealedCacheError:
                pass  # the worker expires an idle session anyway
        self.client.close()

    def __enter__(self) -> RemoteEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_capped(
    response: httpx.Response,
    limit: int,
    ends: float,
    deadline: float,
    path: str,
    ok: bool,
    abandoned: threading.Event,
) -> bytes:
    """The raw body of ``response``, refused past ``limit`` bytes or past the monotonic time ``ends``;
    given up at the next chunk once the caller stopped waiting (``abandoned``)."""
    coding = response.headers.get("content-encoding", "identity").lower()
    if coding != "identity":
        raise SealedCacheError(f"answer to {path} is {coding}-encoded; only identity is read", "transport")
    declared = response.headers.get("content-length", "")
    if ok and declared.isdigit() and int(declared) > limit:
        raise SealedCacheError(
            f"answer to {path} declares {int(declared)} bytes; the expected shapes need {limit}", "size"
        )
    chunks, size = [], 0
    for chunk in response.iter_raw():
        size += len(chunk)
        if size > limit:
            if not ok:
                break  # an error's text, cut
            raise SealedCacheError(
                f"answer to {path} is over {limit} bytes, the size the expected shapes need", "size"
            )
        if time.monotonic() > ends or abandoned.is_set():
            raise SealedCacheError(f"no complete answer to {path} within {deadline:g} s", "deadline")
        chunks.append(chunk)
    if time.monotonic() > ends:
        raise SealedCacheError(f"no complete answer to {path} within {deadline:g} s", "deadline")
    return b"".join(chunks)


def _error_detail(body: bytes) -> str:
    """The worker's ``{"error": text}``, or the start of whatever else it sent."""
    try:
        record = json.loads(body)
    except (ValueError, RecursionError):
        record = None
    if isinstance(record, dict) and isinstance(record.get("error"), str):
        return record["error"][:500]
    return body[:200].decode("utf-8", "replace")


def _header_ms(headers: httpx.Headers, name: str) -> float:
    try:
        return float(headers.get(f"x-whisperkv-{name}-ms", "0"))
    except ValueError:
        return 0.0
