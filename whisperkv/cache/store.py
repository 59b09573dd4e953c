"""Reuse with evidence: encoder outputs and Cross-KV kept by exact provenance.

The store answers "have I already computed this?" only when every provenance field matches: the
same weights, the same log-Mel window (by content digest), the same window position in the source
audio, front-end settings, dtype and device. An offered cache whose provenance differs is refused
with ``CacheReuseError`` naming the field — there is no "close enough".

What computes a missing window is given to the store (``WindowEncoder``): ``LocalEncoder``
(``whisperkv/local_encoder.py``) runs the encoder and projects the Cross-KV in this process;
``whisperkv.boundary.RemoteEncoder`` asks a worker across a trust boundary and opens what it sends
back sealed; the store runs neither itself. A window that arrived as Cross-KV only has no encoder
output here: its ``audio_features`` is empty ([1, 0, d]) and ``has_features`` is False; decoding and
word alignment read only the Cross-KV.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

import torch

from whisperkv.boundary.costs import WindowCosts
from whisperkv.cache.kv import CrossKV
from whisperkv.cache.provenance import EncoderProvenance, first_difference
from whisperkv.errors import CacheReuseError

if TYPE_CHECKING:
    from whisperkv.decoding.options import DecodingResult
    from whisperkv.model.whisper import Whisper


def check_reuse(kind: str, cached: object, requested: object) -> None:
    """Raise ``CacheReuseError`` naming the first provenance field that differs."""
    diff = first_difference(cached, requested)
    if diff is not None:
        name, a, b = diff
        raise CacheReuseError(kind, name, a, b)


@dataclass
class EncodedWindow:
    """One encoder output, its provenance, and the Cross-KV projected from it."""

    provenance: EncoderProvenance
    audio_features: torch.Tensor  # [1, 1500, d]; [1, 0, d] when only the Cross-KV arrived
    cross_kv: list[CrossKV]
    costs: WindowCosts | None = None
    handed_out_at: float = field(default=0.0, repr=False)  # perf_counter when the store last returned it

    @property
    def has_features(self) -> bool:
        return self.audio_features.shape[1] > 0


class WindowEncoder(Protocol):
    """Computes one window's encoder output and Cross-KV for the store (in process or remote)."""

    def encode(
        self, model: Whisper, mel: torch.Tensor, provenance: EncoderProvenance, reason: str
    ) -> EncodedWindow: ...


@dataclass
class CacheStore:
    """Per-job store. Not shared between jobs, so concurrent decodes never see each other's caches.

    ``encoder`` computes a missing window (``whisperkv.local_encoder.LocalEncoder`` in this process):
    the store itself runs nothing, it records and checks."""

    encoder: WindowEncoder
    max_entries: int = 4
    #: the request this store computes for; written into every provenance it makes
    request_id: str = ""
    entries: dict[EncoderProvenance, EncodedWindow] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)
    misses: int = 0
    refusals: list[str] = field(default_factory=list)
    window_costs: list[WindowCosts] = field(default_factory=list)

    def encode(
        self, model: Whisper, mel: torch.Tensor, window_start: int, window_end: int, reason: str = ""
    ) -> EncodedWindow:
        """The encoder output and Cross-KV for this exact window, computed at most once."""
        mel = mel if mel.ndim == 3 else mel.unsqueeze(0)
        mel = mel.to(model.device, model.dtype)
        provenance = replace(
            model.encoder_provenance(mel, window_start, window_end), request_id=self.request_id
        )
        found = self.entries.get(provenance)
        if found is not None:
            check_reuse(
                "encoder output", found.provenance, provenance
            )  # dict equality already; belt and braces
            self.hits.append(reason or "window re-encoded")
            found.handed_out_at = time.perf_counter()
            return found
        self.misses += 1
        # room first: a full store would otherwise hold max_entries windows while computing one more
        # (base: 40 MB of Cross-KV and encoder output a window)
        while self.entries and len(self.entries) >= self.max_entries:
            self.entries.pop(next(iter(self.entries)))
        window = self.encoder.encode(model, mel, provenance, reason)
        # an encoder answers for the window it was asked for, or not at all
        if window.provenance != provenance:
            check_reuse("encoder output", window.provenance, provenance)
        if window.costs is not None:
            self.window_costs.append(window.costs)
        self.entries[provenance] = window
        window.handed_out_at = time.perf_counter()
        return window

    def record_decode(self, window: EncodedWindow, result: DecodingResult) -> None:
        """Charge the time since ``window`` was handed out (its decode, fallbacks included) to its costs."""
        if window.costs is not None:
            window.costs.add_decode((time.perf_counter() - window.handed_out_at) * 1000, len(result.tokens))

    def costs(self) -> list[dict]:
        """Per encoded window, every stage's cost (see ``whisperkv.boundary.costs.WindowCosts``)."""
        return [c.to_dict() for c in self.window_costs]

    def offer(self, window: EncodedWindow, requested: EncoderProvenance) -> EncodedWindow:
        """Accept ``window`` for a computation that needs ``requested``, or refuse and say why."""
        try:
            check_reuse("Cross-KV", window.provenance, requested)
        except CacheReuseError as err:
            self.refusals.append(str(err))
            raise
        self.hits.append("offered window accepted")
        return window

    def report(self) -> dict:
        return {"hits": list(self.hits), "misses": self.misses, "refusals": list(self.refusals)}
