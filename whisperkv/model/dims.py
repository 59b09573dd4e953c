"""Model dimensions: the ten numbers that fix the shape of every Whisper tensor.

Field names follow openai-whisper's ``ModelDimensions`` so an OpenAI checkpoint's ``dims`` dict maps
onto this class one to one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelDims:
    n_mels: int  # Mel bins of the input spectrogram (80, or 128 for large-v3 / turbo)
    n_audio_ctx: int  # encoder positions per 30 s window (1500 = 3000 Mel frames / stride 2)
    n_audio_state: int  # encoder width d
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int  # 51864 for .en models, 51865 multilingual, 51866 for large-v3 (100 languages)
    n_text_ctx: int  # decoder positions: 448 tokens at most
    n_text_state: int  # decoder width
    n_text_head: int
    n_text_layer: int

    @property
    def is_multilingual(self) -> bool:
        return self.n_vocab >= 51865

    @property
    def num_languages(self) -> int:
        return self.n_vocab - 51765 - int(self.is_multilingual)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def _dims(n_state: int, n_head: int, n_layer: int, n_vocab: int, n_mels: int = 80, n_text_layer: int = 0):
    return ModelDims(
        n_mels=n_mels,
        n_audio_ctx=1500,
        n_audio_state=n_state,
        n_audio_head=n_head,
        n_audio_layer=n_layer,
        n_vocab=n_vocab,
        n_text_ctx=448,
        n_text_state=n_state,
        n_text_head=n_head,
        n_text_layer=n_text_layer or n_layer,
    )


EN, MULTI, V3 = 51864, 51865, 51866

#: Published dimensions of every released Whisper size (used by ``inspect`` and random-weight models).
KNOWN_DIMS: dict[str, ModelDims] = {
    "tiny.en": _dims(384, 6, 4, EN),
    "tiny": _dims(384, 6, 4, MULTI),
    "base.en": _dims(512, 8, 6, EN),
    "base": _dims(512, 8, 6, MULTI),
    "small.en": _dims(768, 12, 12, EN),
    "small": _dims(768, 12, 12, MULTI),
    "medium.en": _dims(1024, 16, 24, EN),
    "medium": _dims(1024, 16, 24, MULTI),
    "large-v1": _dims(1280, 20, 32, MULTI),
    "large-v2": _dims(1280, 20, 32, MULTI),
    "large-v3": _dims(1280, 20, 32, V3, n_mels=128),
    "large-v3-turbo": _dims(1280, 20, 32, V3, n_mels=128, n_text_layer=4),
}
KNOWN_DIMS["large"] = KNOWN_DIMS["large-v3"]
KNOWN_DIMS["turbo"] = KNOWN_DIMS["large-v3-turbo"]
