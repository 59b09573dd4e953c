"""Raw audio in: 16-bit little-endian PCM to float samples, and 24 kHz to 16 kHz.

Resampling uses PyAV's resampler (FFmpeg's swresample), which keeps its filter state between pieces,
so a stream resampled piece by piece matches the stream resampled whole.
"""

from __future__ import annotations

import av
import numpy as np


class PCMError(ValueError):
    """Bytes that are not 16-bit PCM (an odd count)."""


def pcm16_to_float(data: bytes) -> np.ndarray:
    if len(data) % 2:
        raise PCMError(f"odd number of bytes ({len(data)}): not 16-bit PCM")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


class Resampler:
    """Mono 16-bit PCM at ``rate`` → 16 kHz float32, piece by piece."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.resampler = av.AudioResampler(format="s16", layout="mono", rate=16000) if rate != 16000 else None
        self.pts = 0

    def __call__(self, data: bytes) -> np.ndarray:
        if self.resampler is None:
            return pcm16_to_float(data)
        if len(data) % 2:
            raise PCMError(f"odd number of bytes ({len(data)}): not 16-bit PCM")
        if not data:
            return np.zeros(0, dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(
            np.frombuffer(data, dtype="<i2")[None, :], format="s16", layout="mono"
        )
        frame.sample_rate = self.rate
        frame.pts = self.pts
        self.pts += len(data) // 2
        return _floats(self.resampler.resample(frame))

    def flush(self) -> np.ndarray:
        return (
            _floats(self.resampler.resample(None)) if self.resampler is not None else np.zeros(0, np.float32)
        )


def _floats(frames: list) -> np.ndarray:
    if not frames:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32) / 32768.0
