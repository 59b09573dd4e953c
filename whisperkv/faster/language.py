"""faster-whisper's language detection: up to ``segments`` 30 s windows, stop at the first sure one.

Each window is encoded and read by whisperkv's detector (one decoder step after <|startoftranscript|>,
``whisperkv.decoding.language``). The first window whose top language is above ``threshold`` decides;
when none is, the language most often on top wins, with its best probability (faster-whisper's vote).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np

from whisperkv.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
from whisperkv.decoding.language import detect_language_from_features

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper

#: what detection reports on an English-only model: English, surely, and no distribution
ENGLISH_ONLY = ("en", 1.0, None)


def ranked(probs: dict[str, float]) -> list[tuple[str, float]]:
    """Every language with its probability, most likely first (``TranscriptionInfo.all_language_probs``)."""
    return sorted(probs.items(), key=lambda item: item[1], reverse=True)


def detect(
    model: Whisper, audio: np.ndarray, segments: int = 1, threshold: float | None = 0.5
) -> tuple[str, float, list[tuple[str, float]] | None]:
    """(language, its probability, all languages ranked) from the first ``segments`` windows of ``audio``."""
    if not model.is_multilingual:
        return ENGLISH_ONLY
    if not isinstance(segments, int) or segments < 1:
        raise ValueError(f"language_detection_segments must be an integer >= 1, got {segments!r}")
    audio = audio[: segments * N_SAMPLES]
    mel = log_mel_spectrogram(audio, model.dims.n_mels, padding=N_SAMPLES)
    content = max(mel.shape[-1] - N_FRAMES, 1)
    tops: dict[str, list[float]] = defaultdict(list)
    all_probs: list[tuple[str, float]] = []
    for start in range(0, content, N_FRAMES):
        window = pad_or_trim(mel[:, start : start + N_FRAMES], N_FRAMES)[None]
        features = model.embed_audio(window.to(model.device, model.dtype))
        _, probs = detect_language_from_features(model, features)
        all_probs = ranked(probs)
        language, probability = all_probs[0]
        if threshold is not None and probability > threshold:
            return language, probability, all_probs
        tops[language].append(probability)
    language = max(tops, key=lambda code: len(tops[code]))
    return language, max(tops[language]), all_probs
