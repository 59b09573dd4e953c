"""What a cache was made from. Two caches are interchangeable only if these records are equal.

An encoder output is identified by the weights that computed it, the exact input window and the
request it was computed for (so nothing computed for one request serves another); a Cross-KV adds
the decoder layer that projected it; a Self-KV adds the prefix tokens and positions it holds.
``first_difference`` names the first field that differs, so a refusal can say why.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class EncoderProvenance:
    """Identity of one encoder output."""

    weights_digest: str  # digest of the model weights that ran the encoder
    mel_digest: str  # digest of the exact log-Mel window fed to the encoder
    window_start: int  # first sample of the window in the source audio
    window_end: int  # one past the last sample of the window
    frontend: str  # log-Mel settings, e.g. "n_mels=80,n_fft=400,hop=160"
    dtype: str
    device: str
    #: the request the output was computed for: never served to another, even for identical audio
    request_id: str = ""


@dataclass(frozen=True)
class CrossKVProvenance:
    encoder: EncoderProvenance
    layer: int


@dataclass(frozen=True)
class SelfKVProvenance:
    prefix: tuple[int, ...]  # token ids whose keys/values the cache holds, in order
    start_position: int  # position index of prefix[0]
    cross_kv: CrossKVProvenance | None  # the Cross-KV (encoder output and layer) those tokens attended to
    request_id: str = ""  # the request whose rows these are (a Self-KV is never shared either)


def first_difference(
    cached: object, requested: object, prefix: str = ""
) -> tuple[str, object, object] | None:
    """The first (dotted field name, cached value, requested value) that differs, or None."""
    if type(cached) is not type(requested):
        return (prefix or "type", type(cached).__name__, type(requested).__name__)
    if not hasattr(cached, "__dataclass_fields__"):
        return None if cached == requested else (prefix or "value", cached, requested)
    for f in fields(cached):  # type: ignore[arg-type]
        a, b = getattr(cached, f.name), getattr(requested, f.name)
        name = f"{prefix}.{f.name}" if prefix else f.name
        if hasattr(a, "__dataclass_fields__") and hasattr(b, "__dataclass_fields__"):
            diff = first_difference(a, b, name)
            if diff:
                return diff
        elif a != b:
            return (name, a, b)
    return None
