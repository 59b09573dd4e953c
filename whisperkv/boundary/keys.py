"""Session keys: HKDF over the shared secret, both sides' fresh nonces and each side's measurement.

A session key exists only for one request (its fresh nonces) and only for a worker whose measurement —
weights digest, whisperkv version, carry mode — is the one the decoder expects: the decoder derives the
key from what it *expects*, the worker from what it *is*, so a worker with other weights (or another
secret) derives another key and nothing it seals opens. Standing in for remote attestation, the
measurement here is self-reported by the worker's code; docs/boundary.md says what that does not prove.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from whisperkv.boundary.associated_data import FORMAT_VERSION, canonical

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper

KEY_BYTES = 32  # AES-256
NONCE_BYTES = 32  # each side's fresh handshake nonce
MIN_SECRET_BYTES = 16
CARRY_MODES = ("features", "cross_kv")

#: the 12-byte AEAD nonce is (direction, part index, sequence number): unique under one session key
DIRECTION_REQUEST, DIRECTION_RESPONSE, DIRECTION_CONFIRM = 1, 2, 3


@dataclass(frozen=True)
class Measurement:
    """What a worker is: the weights it runs, the code version, and what it sends back."""

    weights_digest: str
    whisperkv_version: str
    carry: str

    def to_dict(self) -> dict:
        return asdict(self)


def measure(model: Whisper, carry: str) -> Measurement:
    """This process's measurement for ``model`` in ``carry`` mode."""
    from whisperkv import __version__

    if carry not in CARRY_MODES:
        raise ValueError(f"unknown carry mode {carry!r}: features or cross_kv")
    return Measurement(model.weights_digest, __version__, carry)


def read_secret(path: str | os.PathLike) -> bytes:
    """The shared secret: the file's bytes (a trailing newline dropped), at least 16 of them."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise ValueError(f"secret file {path}: {err.strerror or err}") from None
    data = data.rstrip(b"\r\n")
    if len(data) < MIN_SECRET_BYTES:
        raise ValueError(f"secret file {path}: {len(data)} bytes; at least {MIN_SECRET_BYTES} are needed")
    return data


def fresh_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def derive_session_key(
    secret: bytes, client_nonce: bytes, worker_nonce: bytes, request_id: str, measurement: Measurement
) -> bytes:
    """HKDF-SHA256: salt = both fresh nonces, info = protocol, request id and measurement."""
    info = canonical(
        {
            "protocol": "whisperkv-boundary",
            "format": FORMAT_VERSION,
            "request_id": request_id,
            "measurement": measurement.to_dict(),
        }
    )
    return HKDF(
        algorithm=hashes.SHA256(), length=KEY_BYTES, salt=client_nonce + worker_nonce, info=info
    ).derive(secret)


def aead_nonce(direction: int, part: int, seq: int) -> bytes:
    """12 bytes: direction (1), part index (3), sequence number (8). Never repeats under one key."""
    if not 0 <= part < 2**24 or not 0 <= seq < 2**64:
        raise ValueError(f"part {part} or sequence number {seq} out of range")
    return bytes([direction]) + part.to_bytes(3, "big") + seq.to_bytes(8, "big")
