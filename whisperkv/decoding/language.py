"""Language detection: one decoder step after <|startoftranscript|>, read over the language tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from whisperkv.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper


@torch.no_grad()
def detect_language_from_features(
    model: Whisper, audio_features: torch.Tensor
) -> tuple[str, dict[str, float]]:
    """Most likely language and the probability of every language, from one encoder output."""
    tokenizer = model.tokenizer
    if not model.is_multilingual:
        raise ValueError("this model is English-only: it has no language detection")
    features = audio_features[:1].to(model.device, model.dtype)
    sot = torch.tensor([[tokenizer.sot]], device=model.device)
    logits = model.decoder.forward_uncached(sot, features)[0, 0]
    lang_ids = torch.tensor(tokenizer.all_language_tokens, device=logits.device)
    probs = torch.softmax(logits[lang_ids].float(), dim=-1).tolist()
    language_probs = dict(zip(tokenizer.all_language_codes, probs))
    return max(language_probs, key=language_probs.get), language_probs


def detect_language(
    model: Whisper, audio_or_mel: str | np.ndarray | torch.Tensor
) -> tuple[str, dict[str, float]]:
    """Detect from the first 30 s of a path, waveform or Mel window."""
    if isinstance(audio_or_mel, torch.Tensor) and audio_or_mel.ndim >= 2:
        mel = audio_or_mel
    else:
        mel = log_mel_spectrogram(audio_or_mel, model.dims.n_mels)
    mel = pad_or_trim(mel if mel.ndim == 3 else mel.unsqueeze(0), N_FRAMES)
    return detect_language_from_features(model, model.embed_audio(mel))
