"""Whisper = AudioEncoder + TextDecoder + the facts needed to use them (dims, tokenizer, heads).

Weights are plain tensors loaded once; the model holds no per-decode state, so one instance can
serve many concurrent decodes (each decode owns its own ``DecoderCache``). openai-whisper's
``model.decode`` / ``model.transcribe`` / ``model.detect_language`` are bound onto the class by the
package's front (``whisperkv/__init__.py``): the network never imports the decoding loop.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from whisperkv.cache.digest import combine, tensor_digest
from whisperkv.cache.provenance import EncoderProvenance
from whisperkv.model.decoder import TextDecoder
from whisperkv.model.dims import ModelDims
from whisperkv.model.encoder import AudioEncoder

if TYPE_CHECKING:
    from whisperkv.tokenizer import Tokenizer

#: windows encoded together on the CPU (tiny.en, 2 cores: 95 ms per window in groups of 2, 110 in 16)
CPU_ENCODER_GROUP = 2


class Whisper(nn.Module):
    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        self.dims = dims
        self.encoder = AudioEncoder(
            dims.n_mels, dims.n_audio_ctx, dims.n_audio_state, dims.n_audio_head, dims.n_audio_layer
        )
        self.decoder = TextDecoder(
            dims.n_vocab, dims.n_text_ctx, dims.n_text_state, dims.n_text_head, dims.n_text_layer
        )
        self.alignment_heads: list[tuple[int, int]] | None = None
        self.tokenizer_path: Path | None = None
        self.name = ""
        self.source = ""
        self.compute_type = "default"

    def fuse_qkv(self) -> None:
        """Fuse every self-attention's query/key/value projections (same numbers, fewer matmuls).

        Done once the weights sit on their device in their dtype; cross-attention is left alone: its
        keys/values are projected once per window, its queries once per step.
        """
        for block in [*self.encoder.blocks, *self.decoder.blocks]:
            block.attn.fuse_qkv()

    @property
    def is_multilingual(self) -> bool:
        return self.dims.is_multilingual

    @property
    def num_languages(self) -> int:
        return self.dims.num_languages

    @property
    def device(self) -> torch.device:
        return self.decoder.positional_embedding.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.positional_embedding.dtype

    @cached_property
    def weights_digest(self) -> str:
        """Digest of every weight tensor, computed once: the root of all cache provenance."""
        return state_digest(self.state_dict())

    @cached_property
    def tokenizer(self) -> Tokenizer:
        from whisperkv.tokenizer import Tokenizer

        if self.tokenizer_path is None:
            from whisperkv.weights.registry import default_tokenizer_path

            self.tokenizer_path = default_tokenizer_path(self.dims)
        return Tokenizer.from_file(
            self.tokenizer_path, multilingual=self.is_multilingual, num_languages=self.num_languages
        )

    def frontend(self) -> str:
        return f"n_mels={self.dims.n_mels},n_fft=400,hop=160"

    def encoder_provenance(
        self, mel: torch.Tensor, window_start: int = 0, window_end: int | None = None
    ) -> EncoderProvenance:
        return EncoderProvenance(
            weights_digest=self.weights_digest,
            mel_digest=tensor_digest(mel),
            window_start=window_start,
            window_end=window_end if window_end is not None else window_start + mel.shape[-1] * 160,
            frontend=self.frontend(),
            dtype=str(self.dtype).replace("torch.", ""),
            device=str(self.device),
        )

    @property
    def encoder_dtype(self) -> torch.dtype:
        """The encoder's own dtype: the int8 compute type may run it in bfloat16 (``quantize.py``)."""
        return self.encoder.conv1.weight.dtype

    @torch.no_grad()
    def embed_audio(self, mel: torch.Tensor) -> torch.Tensor:
        """Encoder output [B, 1500, d] for log-Mel windows [B, n_mels, 3000], in the model's dtype.

        On the CPU a batch is encoded a few windows at a time: the activations of many 1,500-position
        windows spill out of the caches, and a window of a batch of 16 then costs more than one alone.
        """
        mel = mel.to(self.device, self.encoder_dtype)
        group = CPU_ENCODER_GROUP if self.device.type == "cpu" else mel.shape[0]
        if mel.shape[0] <= group:
            return self.encoder(mel).to(self.dtype)
        return torch.cat([self.encoder(part).to(self.dtype) for part in mel.split(group)])

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor, audio_features: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, vocab] of whole token sequences [B, T] against encoder output, nothing cached.

        openai-whisper's ``model.logits``: a one-off forward pass (language detection, scoring); decoding
        itself goes through the caches.
        """
        features = audio_features.to(self.device, self.dtype)
        return self.decoder.forward_uncached(tokens.to(self.device), features)

    def forward(self, mel: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``model(mel, tokens)`` as in openai-whisper: encode the windows, then :meth:`logits`."""
        return self.logits(tokens, self.embed_audio(mel))


def state_digest(
    state: dict[str, torch.Tensor],
    as_float32: bool = False,
    after_each: Callable[[torch.Tensor], None] | None = None,
) -> str:
    """Digest of a state dict (``Whisper.weights_digest``). ``as_float32``: each float16 tensor hashed as
    its exact float32 widening, one at a time: a model held in float16 while it is quantised block by
    block (``cpu/quantize.py``) gets the digest of the float32 model it stands for. ``after_each`` is
    called with each tensor once hashed (a memory-mapped checkpoint hands its pages back)."""
    parts = []
    for name, tensor in sorted(state.items()):
        parts += [name, tensor_digest(tensor, widen_float16=as_float32)]
        if after_each is not None:
            after_each(tensor)
    return combine(parts)
