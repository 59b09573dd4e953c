"""Reuse with evidence: encoder outputs and Cross-KV kept by exact provenance.

The store answers "have I already computed this?" only when every provenance field matches: the
same weights, the same log-Mel window (by content digest), the same window position in the source
audio, front-end settings, dtype and device. An offered cache whose provenance differs is refused
with ``CacheReuseError`` naming the field — there is no "close enough".
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from whisperkv.cache.kv import CrossKV
from whisperkv.cache.provenance import EncoderProvenance, first_difference
from whisperkv.errors import CacheReuseError

if TYPE_CHECKING:
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
    audio_features: torch.Tensor
    cross_kv: list[CrossKV]


@dataclass
class CacheStore:
    """Per-job store. Not shared between jobs, so concurrent decodes never see each other's caches."""

    max_entries: int = 4
    #: the request this store computes for; written into every provenance it makes
    request_id: str = ""
    entries: dict[EncoderProvenance, EncodedWindow] = field(default_factory=dict)
    hits: list[str] = field(default_factory=list)
    misses: int = 0
    refusals: list[str] = field(default_factory=list)

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
            return found
        self.misses += 1
        features = model.embed_audio(mel)
        window = EncodedWindow(provenance, features, model.decoder.project_cross_kv(features, provenance))
        if len(self.entries) >= self.max_entries:
            self.entries.pop(next(iter(self.entries)))
        self.entries[provenance] = window
        return window

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
