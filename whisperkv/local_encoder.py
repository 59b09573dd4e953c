"""The window encoder that runs in this process: the network's encoder, then the Cross-KV projection.

The cache store (``cache/store.py``) records and checks what an encoder made; it never runs one. This
is the encoder every local path hands it (``transcribe``, the engine, streaming, ``verify``);
``whisperkv.boundary.RemoteEncoder`` is the one across a trust boundary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from whisperkv.boundary.costs import WindowCosts, stopwatch
from whisperkv.cache.store import EncodedWindow

if TYPE_CHECKING:
    import torch

    from whisperkv.cache.provenance import EncoderProvenance
    from whisperkv.model.whisper import Whisper


class LocalEncoder:
    """``model.embed_audio`` then ``model.decoder.project_cross_kv``, in this process, each timed."""

    def encode(
        self, model: Whisper, mel: torch.Tensor, provenance: EncoderProvenance, reason: str = ""
    ) -> EncodedWindow:
        with stopwatch() as encoder_ms:
            features = model.embed_audio(mel)
        with stopwatch() as projection_ms:
            cross_kv = model.decoder.project_cross_kv(features, provenance)
        costs = WindowCosts(
            provenance.window_start,
            provenance.window_end,
            "local",
            encoder_ms=encoder_ms[0],
            projection_ms=projection_ms[0],
        )
        return EncodedWindow(provenance, features, cross_kv, costs)
