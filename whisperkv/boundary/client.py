"""The decoder's side of the boundary: ``RemoteEncoder`` asks a worker to encode a window, sealed.

It plugs into ``CacheStore`` like the local encoder. On first use it runs the handshake (one session,
one request id, one key), then for each window: seal the exact log-Mel window under its label, POST it,
check the labels of what comes back against the ones it expects, open every part, and only then build
the encoder output or the ``CrossKV`` objects, carrying the provenance it just verified. Anything else —
an error status, a malformed, altered, truncated, swapped or replayed blob — is a ``SealedCacheError``.
"""

from __future__ import annotations

import secrets
import threading
from typing import TYPE_CHECKING

import httpx
import torch

from whisperkv.boundary.costs import WindowCosts, stopwatch
from whisperkv.boundary.handshake import ClientHello, client_finish
from whisperkv.boundary.keys import DIRECTION_REQUEST, DIRECTION_RESPONSE, fresh_nonce, measure
from whisperkv.boundary.protocol import request_label, response_labels
from whisperkv.boundary.replay import DecoderSequence
from whisperkv.boundary.sealing import open_sealed, seal, tensor_bytes, tensor_from_bytes
from whisperkv.cache.kv import CrossKV
from whisperkv.cache.provenance import CrossKVProvenance, EncoderProvenance
from whisperkv.cache.store import EncodedWindow
from whisperkv.errors import SealedCacheError

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper

#: worker cost headers (milliseconds; informative only, never trusted for a decision)
COST_HEADERS = ("open", "encoder", "projection", "seal")


class RemoteEncoder:
    """Encode windows on a worker at ``url`` (``http://127.0.0.1:8001``), sealed with ``secret``."""

    def __init__(
        self,
        url: str,
        secret: bytes,
        carry: str = "features",
        timeout: float = 120.0,
        client: httpx.Client | None = None,
    ) -> None:
        if carry not in ("features", "cross_kv"):
            raise ValueError(f"unknown carry mode {carry!r}: features or cross_kv")
        self.url = url.rstrip("/")
        self.secret = secret
        self.carry = carry
        self.client = client or httpx.Client(timeout=timeout, trust_env=False)
        self.request_id = ""
        self._key: bytes | None = None
        self._weights_digest = ""
        self._sequence = DecoderSequence()
        self._lock = threading.Lock()

    def _post(self, path: str, **kwargs) -> httpx.Response:
        try:
            response = self.client.post(self.url + path, **kwargs)
        except httpx.HTTPError as err:
            raise SealedCacheError(f"encoder worker {self.url} unreachable: {err}", "transport") from None
        if response.status_code != 200:
            try:
                detail = response.json().get("error", response.text)
            except ValueError:
                detail = response.text[:200]
            raise SealedCacheError(
                f"encoder worker refused {path} with status {response.status_code}: {detail}", "worker"
            )
        return response

    def _session(self, model: Whisper) -> bytes:
        """The session key for ``model``, after a handshake the first time."""
        with self._lock:
            if self._key is not None:
                if model.weights_digest != self._weights_digest:
                    raise ValueError(
                        "a RemoteEncoder session serves one model; make another for other weights"
                    )
                return self._key
            hello = ClientHello(secrets.token_hex(16), fresh_nonce(), measure(model, self.carry))
            response = self._post("/v1/session", json=hello.to_json())
            try:
                answer = response.json()
            except ValueError:
                raise SealedCacheError("handshake answer is not JSON", "handshake") from None
            self._key = client_finish(self.secret, hello, answer)
            self.request_id = hello.request_id
            self._weights_digest = model.weights_digest
            return self._key

    def encode(
        self, model: Whisper, mel: torch.Tensor, provenance: EncoderProvenance, reason: str = ""
    ) -> EncodedWindow:
        """One window encoded remotely; ``mel`` [1, n_mels, 3000] is the window ``provenance`` names."""
        if self.carry == "cross_kv" and reason == "language detection":
            raise ValueError(
                "language detection needs the encoder output, which --carry cross_kv does not bring back: "
                "pass --language, or use --carry features"
            )
        key = self._session(model)
        seq = self._sequence.issue()
        asked = request_label(model, provenance, self.request_id, seq)
        costs = WindowCosts(provenance.window_start, provenance.window_end, self.carry)
        with stopwatch() as seal_ms:
            body = seal(key, DIRECTION_REQUEST, [asked], [tensor_bytes(mel)])
        with stopwatch() as round_trip_ms:
            response = self._post(
                "/v1/encode", content=body, headers={"content-type": "application/octet-stream"}
            )
            blob = response.content
        worker = {name: _header_ms(response, name) for name in COST_HEADERS}
        expected = response_labels(model, asked, self.carry)
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
        self.client.close()

    def __enter__(self) -> RemoteEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _header_ms(response: httpx.Response, name: str) -> float:
    try:
        return float(response.headers.get(f"x-whisperkv-{name}-ms", "0"))
    except ValueError:
        return 0.0
