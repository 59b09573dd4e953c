"""What crosses for one window, in each carry mode: the labels both sides build, and the payloads.

Request (decoder → worker): one part, the exact log-Mel window [1, n_mels, 3000] in the model's dtype.
The decoder computes the front end; the worker only sees the window it is asked to encode, sealed.
Response (worker → decoder):
* ``features``: one part, the encoder output [1, 1500, d]; the decoder projects the Cross-KV itself;
* ``cross_kv``: one part per decoder layer, keys and values stacked [2, 1, H, 1500, d/H].
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from whisperkv.boundary.associated_data import FORMAT_VERSION, PartLabel
from whisperkv.cache.provenance import EncoderProvenance

if TYPE_CHECKING:
    from whisperkv.cache.kv import CrossKV
    from whisperkv.model.whisper import Whisper


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def request_label(model: Whisper, provenance: EncoderProvenance, request_id: str, seq: int) -> PartLabel:
    """The label of the log-Mel window the decoder sends for ``provenance``."""
    return PartLabel(
        format=FORMAT_VERSION,
        kind="log_mel",
        weights_digest=provenance.weights_digest,
        mel_digest=provenance.mel_digest,
        window_start=provenance.window_start,
        window_end=provenance.window_end,
        frontend=provenance.frontend,
        dtype=provenance.dtype,
        shape=(1, model.dims.n_mels, 2 * model.dims.n_audio_ctx),
        layer=-1,
        request_id=request_id,
        seq=seq,
    )


def response_labels(model: Whisper, request: PartLabel, carry: str) -> list[PartLabel]:
    """The labels of what comes back for ``request``: what the decoder expects, what the worker seals."""
    dims = model.dims
    if carry == "features":
        return [
            replace(
                request,
                kind="features",
                dtype=dtype_name(model.dtype),
                shape=(1, dims.n_audio_ctx, dims.n_audio_state),
            )
        ]
    kv_dtype = dtype_name(model.decoder.kv_dtype or model.dtype)
    head_width = dims.n_text_state // dims.n_text_head
    shape = (2, 1, dims.n_text_head, dims.n_audio_ctx, head_width)
    return [
        replace(request, kind="cross_kv", dtype=kv_dtype, shape=shape, layer=layer)
        for layer in range(dims.n_text_layer)
    ]


def cross_kv_payload(kv: CrossKV) -> torch.Tensor:
    """One layer's keys and values as the single tensor its part holds."""
    return torch.stack([kv.key.contiguous(), kv.value.contiguous()])
