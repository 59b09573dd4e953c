"""What the long-form loop reads from its audio: its length, exact log-Mel frames, and raw samples.

The loop never needs the whole waveform or spectrogram at once — only the frames of the window it is
about to encode and the samples under it (to skip digital silence). Keeping that behind one small
interface lets a source hold everything in memory (an array given by the caller) or read a long file
window by window, and the loop cannot tell the difference: both give the same numbers.

The log-Mel is the one ``log_mel_spectrogram(audio, n_mels, padding=N_SAMPLES)`` computes, so frame
``content_frames`` onwards is the 30 s of zero padding that completes the last window.
"""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from whisperkv.audio import HOP_LENGTH, N_SAMPLES, load_audio, log_mel_spectrogram
from whisperkv.errors import AudioError


@runtime_checkable
class AudioSource(Protocol):
    """A 16 kHz mono recording as the long-form loop reads it."""

    name: str  # what error messages call it: a path, or "<array>"
    n_samples: int  # length of the audio, in samples

    @property
    def content_frames(self) -> int:
        """Log-Mel frames that hold audio (100 per second); the padding follows them."""
        ...

    def mel(self, start: int, stop: int) -> torch.Tensor:
        """Log-Mel frames [start, stop) as [n_mels, stop - start] (stop ≤ content_frames + 3000)."""
        ...

    def samples(self, start: int, stop: int) -> torch.Tensor:
        """Waveform samples [start, stop) (clipped to the audio), float32."""
        ...


class InMemorySource:
    """The whole waveform and its padded log-Mel held in memory: for arrays a caller already holds."""

    def __init__(self, audio: np.ndarray | torch.Tensor, n_mels: int, name: str = "<array>") -> None:
        if isinstance(audio, np.ndarray):
            audio = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
        if audio.ndim != 1:
            raise AudioError(name, f"expected a 1-D waveform, got shape {tuple(audio.shape)}")
        if audio.numel() == 0:
            raise AudioError(name, "no audio samples")
        self.name = name
        self.n_samples = int(audio.numel())
        self.audio = audio
        self.log_mel = log_mel_spectrogram(audio, n_mels, padding=N_SAMPLES)

    @property
    def content_frames(self) -> int:
        return self.n_samples // HOP_LENGTH

    def mel(self, start: int, stop: int) -> torch.Tensor:
        return self.log_mel[:, start:stop]

    def samples(self, start: int, stop: int) -> torch.Tensor:
        return self.audio[start:stop]


def open_source(
    audio: str | os.PathLike | np.ndarray | torch.Tensor | AudioSource, n_mels: int
) -> AudioSource:
    """An ``AudioSource`` for a path, a waveform, or a source the caller built."""
    if isinstance(audio, AudioSource):
        return audio
    if isinstance(audio, (str, os.PathLike)):
        return InMemorySource(load_audio(audio), n_mels, name=str(audio))
    return InMemorySource(audio, n_mels)
