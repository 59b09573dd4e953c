"""The session handshake: fresh nonces from both sides, a key each side derives alone, a confirmation.

decoder → worker  {format, request_id, client_nonce, measurement the decoder expects, issued_at, tag}
worker  → decoder {worker_nonce, the worker's own measurement, confirm}

The hello's ``tag`` (HMAC-SHA256 under a key derived from the secret) is checked before the worker
keeps anything: without the secret nobody opens a session, nor learns a ``confirm`` to guess it from.
``issued_at`` and the worker's memory of recent request ids refuse a recorded hello sent again.

Each side derives the key from the shared secret, both nonces, the request id and a measurement: the
decoder from the one it expects, the worker from its own. ``confirm`` seals the handshake transcript
under the worker's key, so the decoder learns before any audio is sent that both derived the same key:
the same secret, weights, version and carry mode. A worker that reports another measurement is refused
by name; one that lies about it still fails the confirmation.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, fields

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from whisperkv.boundary.associated_data import FORMAT_VERSION, canonical
from whisperkv.boundary.keys import (
    DIRECTION_CONFIRM,
    NONCE_BYTES,
    Measurement,
    aead_nonce,
    derive_session_key,
    fresh_nonce,
    hello_key,
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


#: how far a hello's ``issued_at`` may be from the worker's clock; a replayed hello is refused after that
MAX_HELLO_SKEW_S = 300
HELLO_FIELDS = frozenset({"format", "request_id", "client_nonce", "measurement", "issued_at", "tag"})
HELLO_TAG_BYTES = 32  # HMAC-SHA256


class HelloRefused(ValueError):
    """A well-formed hello the worker will not act on: not authenticated, stale, or replayed (HTTP 403)."""


@dataclass
class ClientHello:
    request_id: str
    client_nonce: bytes
    expected: Measurement
    issued_at: int = field(default_factory=lambda: int(time.time()))  # Unix seconds, the decoder's clock

    def _signed_part(self) -> bytes:
        return canonical(
            {
                "format": FORMAT_VERSION,
                "request_id": self.request_id,
                "client_nonce": self.client_nonce.hex(),
                "measurement": self.expected.to_dict(),
                "issued_at": self.issued_at,
            }
        )

    def tag(self, secret: bytes) -> bytes:
        """HMAC-SHA256 of everything else in the hello under the hello key (``keys.hello_key``)."""
        mac = hmac.HMAC(hello_key(secret), hashes.SHA256())
        mac.update(self._signed_part())
        return mac.finalize()

    def to_json(self, secret: bytes) -> dict:
        return {**json.loads(self._signed_part()), "tag": self.tag(secret).hex()}


def _hex(value: object, n: int, what: str) -> bytes:
    try:
        data = bytes.fromhex(value) if isinstance(value, str) and len(value) == 2 * n else b""
    except ValueError:
        data = b""
    if len(data) != n:
        raise ValueError(f"{what} must be {n} bytes in hex")
    return data


def _int(value: object) -> bool:
    return type(value) is int


def parse_hello(body: object) -> tuple[ClientHello, bytes]:
    """The worker reads a hello and its tag; a malformed one is a ValueError (HTTP 400). Checks no tag."""
    if not isinstance(body, dict) or not _int(body.get("format")) or body["format"] != FORMAT_VERSION:
        raise ValueError(f"handshake must be a JSON object of format {FORMAT_VERSION}")
    if "tag" not in body:
        raise ValueError("the hello carries no tag: it is not authenticated with the shared secret")
    if set(body) != HELLO_FIELDS:
        raise ValueError(f"the hello must hold exactly the fields {', '.join(sorted(HELLO_FIELDS))}")
    request_id = body["request_id"]
    if not isinstance(request_id, str) or not re.fullmatch(r"[0-9A-Za-z]{8,64}", request_id):
        raise ValueError("request_id must be 8 to 64 ASCII letters or digits")
    m = body["measurement"]
    names = [f.name for f in fields(Measurement)]
    if not isinstance(m, dict) or sorted(m) != sorted(names):
        raise ValueError(f"measurement must hold exactly {', '.join(names)}")
    if not all(isinstance(m[n], str) and len(m[n]) <= 128 for n in names):
        raise ValueError("measurement fields must be strings of at most 128 characters")
    issued_at = body["issued_at"]
    if not _int(issued_at) or not 0 <= issued_at < 2**40:
        raise ValueError("issued_at must be a whole number of seconds since 1970")
    hello = ClientHello(
        request_id,
        _hex(body["client_nonce"], NONCE_BYTES, "client_nonce"),
        Measurement(**{n: m[n] for n in names}),
        issued_at,
    )
    return hello, _hex(body["tag"], HELLO_TAG_BYTES, "tag")


def authenticate_hello(secret: bytes, hello: ClientHello, tag: bytes, now: float) -> None:
    """Refuse (HelloRefused) a hello whose tag is not the secret's, or one issued too far from ``now``."""
    mac = hmac.HMAC(hello_key(secret), hashes.SHA256())
    mac.update(hello._signed_part())
    try:
        mac.verify(tag)
    except InvalidSignature:
        raise HelloRefused(
            "the hello's tag does not verify: the decoder holds another secret than this worker"
        ) from None
    if abs(now - hello.issued_at) > MAX_HELLO_SKEW_S:
        raise HelloRefused(
            f"the hello was issued {now - hello.issued_at:.0f} s from the worker's clock (over "
            f"{MAX_HELLO_SKEW_S} s): a replayed hello, or the two clocks differ"
        )


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


def _close_mac(key: bytes, request_id: str) -> hmac.HMAC:
    mac = hmac.HMAC(key, hashes.SHA256())
    mac.update(canonical({"close": request_id, "format": FORMAT_VERSION, "protocol": "whisperkv-boundary"}))
    return mac


def close_tag(key: bytes, request_id: str) -> bytes:
    """HMAC-SHA256 under the session key: the decoder asks the worker to close ``request_id``'s session."""
    return _close_mac(key, request_id).finalize()


def close_tag_valid(key: bytes, request_id: str, tag: bytes) -> bool:
    try:
        _close_mac(key, request_id).verify(tag)
    except InvalidSignature:
        return False
    return True
