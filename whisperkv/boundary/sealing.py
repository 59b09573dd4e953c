"""Sealed blobs: tensors encrypted and authenticated with AES-256-GCM, each part bound to its label.

Layout (all integers big-endian)::

    b"WKVS" | format (1 byte) | part count (2)
    per part: label length (4) | label | ciphertext length (4) | ciphertext

A part is one tensor (the log-Mel window, the encoder output, or one layer's keys and values); its
label (``PartLabel``) is the AEAD associated data, and its nonce is derived from the direction, the
part index and the label's sequence number, so no nonce repeats under a session key. Sealing per part
keeps every AEAD input far below the library's 2**31 - 1 byte limit (large-v3 float32: 15 MB a layer).

Opening checks, in order: the layout, each label against the expected one (naming the field that
differs), then authentication with the *expected* label, then the payload's length. Only then do bytes
become tensors.
"""

from __future__ import annotations

import struct

import numpy as np
import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from whisperkv.boundary.associated_data import FORMAT_VERSION, PartLabel, check_label, parse_label
from whisperkv.boundary.keys import aead_nonce
from whisperkv.errors import SealedCacheError

MAGIC = b"WKVS"
TAG_BYTES = 16
MAX_PARTS = 256
_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's elements in row-major order (bfloat16 through its 16-bit pattern)."""
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return np.ascontiguousarray(t.numpy()).tobytes()


def tensor_from_bytes(data: bytes, label: PartLabel) -> torch.Tensor:
    """The tensor a label describes, from its opened payload (length already checked)."""
    dtype = _TORCH_DTYPES[label.dtype]
    buffer = bytearray(data)  # writable: torch tensors must not alias read-only memory
    if dtype == torch.bfloat16:
        return torch.frombuffer(buffer, dtype=torch.int16).view(torch.bfloat16).reshape(label.shape)
    return torch.frombuffer(buffer, dtype=dtype).reshape(label.shape)


def seal(key: bytes, direction: int, labels: list[PartLabel], payloads: list[bytes]) -> bytes:
    """One blob holding every payload, each sealed under its own label."""
    if len(labels) != len(payloads) or not 0 < len(labels) <= MAX_PARTS:
        raise ValueError("one label per payload, 1 to 256 parts")
    aead = AESGCM(key)
    out = [MAGIC, struct.pack(">BH", FORMAT_VERSION, len(labels))]
    for index, (label, payload) in enumerate(zip(labels, payloads)):
        ad = label.encode()
        ct = aead.encrypt(aead_nonce(direction, index, label.seq), payload, ad)
        out += [struct.pack(">I", len(ad)), ad, struct.pack(">I", len(ct)), ct]
    return b"".join(out)


def sealed_size(labels: list[PartLabel]) -> int:
    """The exact length of the blob that seals parts with these ``labels`` (each label's payload size)."""
    return 7 + sum(8 + len(label.encode()) + label.payload_nbytes + TAG_BYTES for label in labels)


def read_parts(blob: bytes) -> list[tuple[bytes, bytes]]:
    """(label bytes, ciphertext) of every part; a blob that is not laid out exactly so is refused."""
    view = memoryview(blob)
    if len(view) < 7 or bytes(view[:4]) != MAGIC:
        raise SealedCacheError(
            "malformed blob: not a whisperkv sealed blob (bad magic or too short)", "layout"
        )
    version, count = struct.unpack(">BH", view[4:7])
    if version != FORMAT_VERSION:
        raise SealedCacheError(
            f"blob format version {version} is not {FORMAT_VERSION}", "format", version, FORMAT_VERSION
        )
    if not 0 < count <= MAX_PARTS:
        raise SealedCacheError(f"malformed blob: {count} parts", "layout")
    parts, at = [], 7
    for index in range(count):
        pieces = []
        for what in ("label", "ciphertext"):
            if at + 4 > len(view):
                raise SealedCacheError(f"truncated blob: part {index} {what} length missing", "layout")
            (n,) = struct.unpack(">I", view[at : at + 4])
            at += 4
            if at + n > len(view):
                raise SealedCacheError(
                    f"truncated blob: part {index} {what} needs {n} bytes, {len(view) - at} left", "layout"
                )
            pieces.append(bytes(view[at : at + n]))
            at += n
        parts.append((pieces[0], pieces[1]))
    if at != len(view):
        raise SealedCacheError(f"malformed blob: {len(view) - at} bytes after the last part", "layout")
    return parts


def open_part(key: bytes, direction: int, index: int, label: PartLabel, ciphertext: bytes) -> bytes:
    """Authenticate and decrypt one part under ``label``; check its payload has the label's size."""
    try:
        payload = AESGCM(key).decrypt(aead_nonce(direction, index, label.seq), ciphertext, label.encode())
    except InvalidTag:
        raise SealedCacheError(
            f"authentication failed for part {index} (kind {label.kind}, layer {label.layer}): the bytes "
            "were altered, or sealed under another key (another secret, other weights or version, "
            "another session)",
            "authentication",
        ) from None
    if len(payload) != label.payload_nbytes:
        raise SealedCacheError(
            f"part {index} holds {len(payload)} bytes, its label says {label.payload_nbytes}", "shape"
        )
    return payload


def open_sealed(key: bytes, direction: int, blob: bytes, expected: list[PartLabel]) -> list[bytes]:
    """The payloads of a blob whose parts carry exactly the ``expected`` labels, in that order."""
    parts = read_parts(blob)
    if len(parts) != len(expected):
        raise SealedCacheError(
            f"blob has {len(parts)} parts, request needs {len(expected)}", "parts", len(parts), len(expected)
        )
    payloads = []
    for index, ((label_bytes, ct), want) in enumerate(zip(parts, expected)):
        check_label(parse_label(label_bytes), want)
        payloads.append(open_part(key, direction, index, want, ct))
    return payloads
