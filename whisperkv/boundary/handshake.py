"""The session handshake: fresh nonces from both sides, a key each side derives alone, a confirmation.

decoder → worker  {format, request_id, client_nonce, measurement the decoder expects}
worker  → decoder {worker_nonce, the worker's own measurement, confirm}

Each side derives the key from the shared secret, both nonces, the request id and a measurement: the
decoder from the one it expects, the worker from its own. ``confirm`` seals the handshake transcript
under the worker's key, so the decoder learns before any audio is sent that both derived the same key:
the same secret, weights, version and carry mode. A worker that reports another measurement is refused
by name; one that lies about it still fails the confirmation.
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from whisperkv.boundary.associated_data import FORMAT_VERSION, canonical
from whisperkv.boundary.keys import (
    DIRECTION_CONFIRM,
    NONCE_BYTES,
    Measurement,
    aead_nonce,
    derive_session_key,
    fresh_nonce,
)
from whisperkv.errors import SealedCacheError


def _transcript(request_id: str, client_nonce: bytes, worker_nonce: bytes, m: Measurement) -> bytes:
    return canonical(
        {
            "format": FORMAT_VERSION,
            "request_id": request_id,
            "client_nonce": client_nonce.hex(),
            "worker_nonce": worker_nonce.hex(),
            "measurement": m.to_dict(),
        }
    )


@dataclass
class ClientHello:
    request_id: str
    client_nonce: bytes
    expected: Measurement

    def to_json(self) -> dict:
        return {
            "format": FORMAT_VERSION,
            "request_id": self.request_id,
            "client_nonce": self.client_nonce.hex(),
            "measurement": self.expected.to_dict(),
        }


def _hex(value: object, n: int, what: str) -> bytes:
    try:
        data = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        data = b""
    if len(data) != n:
        raise ValueError(f"{what} must be {n} bytes in hex")
    return data


def parse_hello(body: object) -> ClientHello:
    """The worker reads a hello; a malformed one is a ValueError (HTTP 400)."""
    if not isinstance(body, dict) or body.get("format") != FORMAT_VERSION:
        raise ValueError(f"handshake must be a JSON object of format {FORMAT_VERSION}")
    request_id = body.get("request_id")
    if not isinstance(request_id, str) or not 8 <= len(request_id) <= 64 or not request_id.isalnum():
        raise ValueError("request_id must be 8 to 64 letters or digits")
    m = body.get("measurement")
    try:
        expected = Measurement(**m) if isinstance(m, dict) else None
    except TypeError:
        expected = None
    if expected is None:
        raise ValueError("measurement must hold weights_digest, whisperkv_version and carry")
    return ClientHello(request_id, _hex(body.get("client_nonce"), NONCE_BYTES, "client_nonce"), expected)


def worker_answer(secret: bytes, hello: ClientHello, own: Measurement) -> tuple[bytes, dict]:
    """The worker's session key and its answer; the key is derived from its *own* measurement."""
    worker_nonce = fresh_nonce()
    key = derive_session_key(secret, hello.client_nonce, worker_nonce, hello.request_id, own)
    transcript = _transcript(hello.request_id, hello.client_nonce, worker_nonce, own)
    confirm = AESGCM(key).encrypt(aead_nonce(DIRECTION_CONFIRM, 0, 0), b"", transcript)
    return key, {"worker_nonce": worker_nonce.hex(), "measurement": own.to_dict(), "confirm": confirm.hex()}


def client_finish(secret: bytes, hello: ClientHello, answer: object) -> bytes:
    """The decoder's session key, once the worker's measurement and key confirmation check out."""
    if not isinstance(answer, dict):
        raise SealedCacheError("handshake answer is not a JSON object", "handshake")
    reported = answer.get("measurement")
    if isinstance(reported, dict):
        for name, want in hello.expected.to_dict().items():
            if reported.get(name) != want:
                raise SealedCacheError(
                    f"worker measurement '{name}' differs (worker has {reported.get(name)!r}, decoder needs "
                    f"{want!r})",
                    name,
                    reported.get(name),
                    want,
                )
    try:
        worker_nonce = _hex(answer.get("worker_nonce"), NONCE_BYTES, "worker_nonce")
        confirm = bytes.fromhex(answer.get("confirm", ""))
    except (ValueError, TypeError):
        raise SealedCacheError(
            "handshake answer is malformed (worker_nonce / confirm)", "handshake"
        ) from None
    key = derive_session_key(secret, hello.client_nonce, worker_nonce, hello.request_id, hello.expected)
    transcript = _transcript(hello.request_id, hello.client_nonce, worker_nonce, hello.expected)
    try:
        AESGCM(key).decrypt(aead_nonce(DIRECTION_CONFIRM, 0, 0), confirm, transcript)
    except InvalidTag:
        raise SealedCacheError(
            "key confirmation failed: the worker holds another secret, or runs other weights, version or "
            "carry mode than it reports",
            "key confirmation",
        ) from None
    return key
