"""Session keys: HKDF over the shared secret, both sides' fresh nonces and each side's measurement.

A session key exists only for one request (its fresh nonces) and only for a worker whose measurement —
weights digest, whisperkv version, carry mode — is the one the decoder expects: the decoder derives the
key from what it *expects*, the worker from what it *is*, so a worker with other weights (or another
secret) derives another key and nothing it seals opens. Standing in for remote attestation, the
measurement here is self-reported by the worker's code; docs/boundary.md says what that does not prove.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from whisperkv.boundary.associated_data import FORMAT_VERSION, canonical

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper

KEY_BYTES = 32  # AES-256
NONCE_BYTES = 32  # each side's fresh handshake nonce
SECRET_BYTES = 32  # the shared secret: 256 random bits
MIN_DISTINCT_BYTES = 16  # 32 random bytes have about 30 distinct values; under 16 is a pattern
SECRET_HOWTO = "make one with: head -c 32 /dev/urandom > boundary.key; chmod 600 boundary.key"
_TEXT_BYTES = frozenset(range(0x20, 0x7F)) | {0x09, 0x0A, 0x0D}
_MAX_SECRET_FILE_BYTES = 1024
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


def check_secret(secret: bytes, where: str = "the secret") -> bytes:
    """``secret`` if it can be the shared secret: exactly 32 bytes that do not look typed or patterned.

    HKDF stretches nothing, so the secret must carry its full 256 bits; a passphrase would let anyone
    who records one handshake guess it offline. Text-looking bytes (all printable ASCII: a passphrase
    or a hex string written where raw bytes belong) and bytes with under 16 distinct values (a pattern)
    are refused: 32 random bytes are either with a probability under 1e-13.
    """
    if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        n = len(secret) if isinstance(secret, (bytes, bytearray, str)) else "not"
        raise ValueError(
            f"{where}: {n} bytes; the secret is exactly {SECRET_BYTES} random bytes ({SECRET_HOWTO})"
        )
    if all(b in _TEXT_BYTES for b in secret):
        raise ValueError(
            f"{where} looks like text (a passphrase?); the secret is {SECRET_BYTES} random bytes "
            f"({SECRET_HOWTO})"
        )
    if len(set(secret)) < MIN_DISTINCT_BYTES:
        raise ValueError(
            f"{where} has {len(set(secret))} distinct byte values: a pattern, not {SECRET_BYTES} random "
            f"bytes ({SECRET_HOWTO})"
        )
    return secret


def read_secret(path: str | os.PathLike) -> bytes:
    """The shared secret from a file of 32 raw bytes, or of their 64-character hex form (one newline allowed).

    The file must be a regular file that only its owner can read or write (mode 600 or stricter);
    anything else — missing, unreadable, group- or world-accessible, another length, text — is a
    ValueError that names the file and what is wrong.
    """
    where = f"secret file {path}"
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{where} is not a regular file")
        if os.name == "posix" and info.st_mode & 0o077:
            raise ValueError(
                f"{where} is accessible to group or others (mode {stat.S_IMODE(info.st_mode):o}); "
                f"make it private: chmod 600 {path}"
            )
        with open(path, "rb") as f:
            data = f.read(_MAX_SECRET_FILE_BYTES + 1)
    except OSError as err:
        raise ValueError(f"{where}: {err.strerror or err}") from None
    if len(data) > _MAX_SECRET_FILE_BYTES:
        raise ValueError(
            f"{where}: over {_MAX_SECRET_FILE_BYTES} bytes; the secret is {SECRET_BYTES} random bytes"
        )
    text = data if len(data) == SECRET_BYTES else data.rstrip(b"\r\n")
    if len(text) == 2 * SECRET_BYTES and re.fullmatch(rb"[0-9a-fA-F]+", text):
        return check_secret(bytes.fromhex(text.decode("ascii")), where)
    if text and all(b in _TEXT_BYTES for b in text):
        raise ValueError(
            f"{where} holds text ({len(text)} characters, a passphrase?), not {SECRET_BYTES} random bytes or "
            f"their 64-character hex form ({SECRET_HOWTO})"
        )
    return check_secret(data, where)


def hello_key(secret: bytes) -> bytes:
    """The key that authenticates a decoder's hello: HKDF of the secret for that one purpose.

    A worker checks a hello's tag under it before it keeps anything, so only a holder of the secret
    can open a session (and use up one of the worker's session slots).
    """
    info = canonical({"protocol": "whisperkv-boundary", "format": FORMAT_VERSION, "purpose": "hello"})
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


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
