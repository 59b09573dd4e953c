"""What a sealed part claims to be — its provenance — encoded canonically as AEAD associated data.

Both sides build the label of every part from what they know (the decoder: what it asked for; the
worker: what it was asked and what it computed) and encode it to bytes the same way, so equal labels
give equal bytes: JSON with sorted keys, no spaces, ASCII only, no floats. The decoder compares the
label a blob carries with the one it expects field by field (to name the field that differs) and then
opens the part with the *expected* bytes, so a label rewritten in transit cannot pass either way.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from whisperkv.errors import SealedCacheError

#: version of the blob layout and of this label; a blob of another version is refused
FORMAT_VERSION = 1

#: a label is a few hundred bytes; a longer one is refused before it is parsed
MAX_LABEL_BYTES = 2048
#: bounds on a label's integers: positions and sizes far above any real window, below any overflow
MAX_INT = 2**62
MAX_DIMS = 8

#: what a part holds: the log-Mel window sent to the worker, or what the worker sends back
KINDS = ("log_mel", "features", "cross_kv")


def canonical(record: dict) -> bytes:
    """The one byte encoding of a record of strings, integers, lists and nulls."""
    return json.dumps(
        record, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


@dataclass(frozen=True)
class PartLabel:
    """The associated data of one sealed part: everything that says which state it is."""

    format: int  # FORMAT_VERSION
    kind: str  # one of KINDS
    weights_digest: str  # weights that computed (or will compute) it
    mel_digest: str  # digest of the exact log-Mel window (EncoderProvenance.mel_digest)
    window_start: int  # first sample of the window in the source audio
    window_end: int  # one past its last sample
    frontend: str  # log-Mel settings
    dtype: str  # element type of the payload tensor
    shape: tuple[int, ...]  # shape of the payload tensor (Cross-KV: [2 (key, value), B, H, T, d/H])
    layer: int  # decoder layer of a Cross-KV part; -1 for log-Mel and encoder output
    request_id: str  # the decoder's request (one handshake, one session key)
    seq: int  # the window's sequence number within the request

    def encode(self) -> bytes:
        record = asdict(self)
        record["shape"] = list(self.shape)
        return canonical(record)

    @property
    def nbytes_per_element(self) -> int:
        return {"float32": 4, "float16": 2, "bfloat16": 2}[self.dtype]

    @property
    def payload_nbytes(self) -> int:
        n = self.nbytes_per_element
        for s in self.shape:
            n *= s
        return n


def parse_label(data: bytes) -> PartLabel:
    """Read a label from a blob; anything that is not a canonical label is refused (a SealedCacheError)."""
    if len(data) > MAX_LABEL_BYTES:
        raise SealedCacheError(
            f"malformed blob: associated data of {len(data)} bytes (at most {MAX_LABEL_BYTES})",
            "associated data",
        )
    try:
        record = json.loads(data.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SealedCacheError("malformed blob: associated data is not a label", "associated data") from None
    names = [f.name for f in fields(PartLabel)]
    if not isinstance(record, dict) or sorted(record) != sorted(names):
        raise SealedCacheError(
            "malformed blob: associated data does not hold the label fields", "associated data"
        )
    if not isinstance(record["shape"], list) or len(record["shape"]) > MAX_DIMS:
        raise SealedCacheError(
            f"malformed blob: associated data shape is not a list of at most {MAX_DIMS} sizes",
            "associated data",
        )
    label = PartLabel(**{**record, "shape": tuple(record["shape"])})
    types = {
        "format": int,
        "kind": str,
        "weights_digest": str,
        "mel_digest": str,
        "window_start": int,
        "window_end": int,
        "frontend": str,
        "dtype": str,
        "layer": int,
        "request_id": str,
        "seq": int,
    }
    if any(type(record[name]) is not kind for name, kind in types.items()) or not all(
        type(s) is int and 0 <= s < 2**31 for s in label.shape
    ):
        raise SealedCacheError("malformed blob: a label field has the wrong type", "associated data")
    if not (
        0 <= label.window_start < MAX_INT and 0 <= label.window_end < MAX_INT and 0 <= label.seq < MAX_INT
    ):
        raise SealedCacheError(
            "malformed blob: a label's window or sequence number is out of range", "associated data"
        )
    if not -1 <= label.layer < 2**16 or label.format != FORMAT_VERSION:
        raise SealedCacheError("malformed blob: a label's layer or format is out of range", "associated data")
    if label.encode() != data:
        raise SealedCacheError("malformed blob: associated data is not in canonical form", "associated data")
    if label.dtype not in ("float32", "float16", "bfloat16") or label.kind not in KINDS:
        raise SealedCacheError(
            f"malformed blob: unknown dtype or kind in {label.dtype!r}/{label.kind!r}", "dtype"
        )
    return label


def check_label(found: PartLabel, expected: PartLabel) -> None:
    """Refuse, naming the first field, a label that is not exactly the one asked for.

    Which request and which window come first, so a replayed or reordered blob is called that.
    """
    names = ["format", "request_id", "seq"]
    for name in names + [f.name for f in fields(PartLabel) if f.name not in names]:
        have, want = getattr(found, name), getattr(expected, name)
        if have != want:
            what = {"seq": "replayed or reordered blob: ", "request_id": "blob from another request: "}.get(
                name, ""
            )
            raise SealedCacheError(
                f"{what}associated data field '{name}' differs (blob has {have!r}, request needs {want!r})",
                name,
                have,
                want,
            )
