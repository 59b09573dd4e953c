"""Audio in: a file becomes a 16 kHz mono waveform, and a waveform becomes a log-Mel spectrogram.

Whisper never sees raw audio. Its encoder reads a log-Mel spectrogram: 100 frames per second, each frame
the energy in 80 (or 128) perceptually spaced frequency bands. Every model was trained on spectrograms
made exactly one way, so this module reproduces that recipe number for number: decode to 16 kHz mono
16-bit samples, take a 25 ms short-time Fourier transform every 10 ms, pool the power through a Slaney
Mel filterbank, then take a clamped and rescaled log.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, TypeVar

import av
import numpy as np
import torch
import torch.nn.functional as F

from whisperkv.audio_decode import decode_container
from whisperkv.audio_formats import (
    ALLOWED_DEMUXERS,
    DecodeBounds,
    NestedOpenGuard,
    NestedOpenRefused,
    SniffedFormat,
)
from whisperkv.errors import AudioError

# --- The fixed numbers every Whisper checkpoint was trained with --------------------------------------

SAMPLE_RATE = 16000  # samples per second after resampling
N_FFT = 400  # STFT window: 400 samples = 25 ms
HOP_LENGTH = 160  # STFT stride: 160 samples = 10 ms, hence 100 frames per second
CHUNK_LENGTH = 30  # the encoder always looks at exactly 30 seconds
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples in one 30-second window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 spectrogram frames in one window
MEL_BLOCK_FRAMES = 6000  # frames transformed at once by log_mel_spectrogram (bounds its memory)

# The encoder's two convolutions halve the frame rate, so each audio position (and each timestamp
# token step) covers two spectrogram frames: 20 ms.
N_SAMPLES_PER_TOKEN = HOP_LENGTH * 2  # 320 samples
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100 frames per second
TOKENS_PER_SECOND = SAMPLE_RATE // N_SAMPLES_PER_TOKEN  # 50 audio positions per second


# --- File -> waveform (the decoding loop and its checks: audio_decode.py) -----------------------------


def load_audio(path: str | os.PathLike, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Decode any audio file to a mono float32 waveform at ``sr`` Hz, with values in [-1, 1).

    The reference implementation pipes the file through ``ffmpeg -f s16le -ac 1 -ar 16000``. We call the
    same FFmpeg libraries in-process through PyAV and also go through signed 16-bit samples, so the
    waveform (and so the spectrogram) matches what the models were evaluated on.

    Anything that cannot produce a complete waveform raises :class:`AudioError`, never a partial result:
    a transcript of half a file that looks like a transcript of the whole file is worse than an error.
    """
    return int16_to_float(np.concatenate(list(decode_audio(path, sr))))


def int16_to_float(samples: np.ndarray) -> np.ndarray:
    """16-bit samples as float32 in [-1, 1): the one conversion every reader of a file uses."""
    return samples.astype(np.float32) / 32768.0


def decode_audio(path: str | os.PathLike, sr: int = SAMPLE_RATE) -> Iterator[np.ndarray]:
    """The file as consecutive blocks of mono int16 samples at ``sr`` Hz, decoded as they are read.

    Concatenated, the blocks are exactly :func:`load_audio`'s waveform (times 32768); a reader that keeps
    only a few of them holds a bounded amount of audio however long the file is. Every check of
    :func:`load_audio` is made, so a bad file raises :class:`AudioError` while (or after) the blocks
    are read — at the latest when the last one has been, never silently.
    """
    source = str(path)
    file = Path(path)
    if not file.exists():
        raise AudioError(source, "file not found")
    if file.is_dir():
        raise AudioError(source, "is a directory, not a file")
    if file.stat().st_size == 0:
        raise AudioError(source, "empty file")
    return decode_container(source, lambda: av.open(os.fspath(file)), lambda: open(file, "rb"), sr, None)


def decode_untrusted(
    reopen: Callable[[], BinaryIO],
    name: str,
    sniffed: SniffedFormat,
    sr: int = SAMPLE_RATE,
    max_samples: int | None = None,
) -> Iterator[np.ndarray]:
    """:func:`decode_audio` for bytes a client sent: ``reopen()`` gives them from the start (a fresh
    reader each time), read only by ``sniffed``'s demuxer (see :mod:`whisperkv.audio_formats`), with
    no protocol and no nested open allowed, and no packet or frame larger than real encoders make.
    Past ``max_samples`` samples at ``sr`` it raises :class:`~whisperkv.audio_formats.AudioTooLongError`
    and decodes no further, so a tiny file of compressed silence costs no more than the limit."""

    bounds = DecodeBounds(max_samples, sr)

    def open_container() -> av.container.InputContainer:
        bounds.check_structure(name, sniffed.demuxer, reopen)
        guard = NestedOpenGuard()
        try:
            container = av.open(
                reopen(),
                format=sniffed.demuxer,
                container_options={"protocol_whitelist": "none", **sniffed.options},
                io_open=guard,
            )
        except (av.FFmpegError, OSError, EOFError):
            guard.refuse_if_asked()  # the reason it failed, if it tried to open something
            raise
        used = container.format.name
        if guard.asked or used != sniffed.demuxer or used not in ALLOWED_DEMUXERS:
            container.close()
            guard.refuse_if_asked()
            raise NestedOpenRefused(f"opened as {used!r}, which is not an allowed audio demuxer")
        return container

    return decode_container(name, open_container, reopen, sr, bounds)


def audio_duration(waveform: np.ndarray | torch.Tensor) -> float:
    """Length in seconds of a 16 kHz waveform (its last axis)."""
    return waveform.shape[-1] / SAMPLE_RATE


# --- Fitting audio into the 30-second window --------------------------------------------------------

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)


def pad_or_trim(array: ArrayT, length: int = N_SAMPLES, axis: int = -1) -> ArrayT:
    """Cut or zero-pad ``array`` along ``axis`` to exactly ``length`` entries.

    The encoder has a fixed input size (3000 frames), so whatever it is given must be made to fit:
    longer input is cut, shorter input is padded on the right with zeros (silence).
    """
    current = array.shape[axis]
    if current == length:
        return array
    if isinstance(array, torch.Tensor):
        if current > length:
            return array.narrow(axis, 0, length)
        # F.pad lists (left, right) pairs starting from the LAST dimension.
        dims_after = array.dim() - 1 - (axis % array.dim())
        return F.pad(array, [0, 0] * dims_after + [0, length - current])
    if current > length:
        return np.take(array, np.arange(length), axis=axis)
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, length - current)
    return np.pad(array, widths)


# --- Waveform -> log-Mel spectrogram ------------------------------------------------------------------


def _hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
    """Slaney's Mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above."""
    linear = hz * 3.0 / 200.0
    log_part = 15.0 + torch.log(hz.clamp(min=1e-10) / 1000.0) / (math.log(6.4) / 27.0)
    return torch.where(hz >= 1000.0, log_part, linear)


def _mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_hz_to_mel`; 1 kHz sits at exactly 15 mels."""
    linear = mel * 200.0 / 3.0
    log_part = 1000.0 * torch.exp((math.log(6.4) / 27.0) * (mel - 15.0))
    return torch.where(mel >= 15.0, log_part, linear)


@functools.cache
def mel_filters(n_mels: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The Slaney-normalised Mel filterbank Whisper was trained with, shape [n_mels, N_FFT // 2 + 1].

    Row ``i`` is a triangle over the FFT bins: rising from Mel point ``i`` to point ``i + 1`` and falling
    to point ``i + 2``, where the ``n_mels + 2`` points are evenly spaced on the Mel scale from 0 Hz to
    the Nyquist frequency. Each triangle is scaled by ``2 / width_in_hz`` so every band has the same
    area: wide high-frequency bands do not collect more energy merely for being wide. This is
    ``librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels)`` (htk=False, norm="slaney"), computed
    here instead of loaded from a file.
    """
    if n_mels not in (80, 128):
        raise ValueError(f"Whisper models use 80 or 128 Mel bands, not {n_mels}")
    # Work in float64 so the only rounding is the final cast to float32.
    fft_hz = torch.linspace(0.0, SAMPLE_RATE / 2, N_FFT // 2 + 1, dtype=torch.float64)
    nyquist = torch.tensor(SAMPLE_RATE / 2, dtype=torch.float64)
    mel_points = torch.linspace(0.0, float(_hz_to_mel(nyquist)), n_mels + 2, dtype=torch.float64)
    hz_points = _mel_to_hz(mel_points)

    lower, centre, upper = hz_points[:-2, None], hz_points[1:-1, None], hz_points[2:, None]
    rising = (fft_hz - lower) / (centre - lower)
    falling = (upper - fft_hz) / (upper - centre)
    triangles = torch.clamp(torch.minimum(rising, falling), min=0.0)
    slaney_norm = 2.0 / (upper - lower)
    return (triangles * slaney_norm).to(dtype=torch.float32, device=device)


def log_mel_spectrogram(
    audio: str | os.PathLike | np.ndarray | torch.Tensor,
    n_mels: int = 80,
    padding: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The encoder's input: a [n_mels, n_frames] float32 log-Mel spectrogram of 16 kHz mono audio.

    ``audio`` is a path (decoded with :func:`load_audio`) or a 1-D waveform. ``padding`` zero samples are
    appended first; transcription appends 30 s so that the last window is complete. There are
    ``(len(audio) + padding) // HOP_LENGTH`` frames, 100 per second.
    """
    if isinstance(audio, (str, os.PathLike)):
        audio = load_audio(audio)
    waveform = torch.as_tensor(audio, dtype=torch.float32, device=device)
    if waveform.dim() != 1:
        raise ValueError(f"expected a 1-D waveform, got shape {tuple(waveform.shape)}")
    if padding > 0:
        waveform = F.pad(waveform, (0, padding))

    # 25 ms periodic Hann windows every 10 ms. Centring reflect-pads N_FFT // 2 samples at both ends, so
    # frame t is centred on sample t * HOP_LENGTH; it yields one frame more than len // HOP_LENGTH, and
    # Whisper drops the last one.
    n_frames = waveform.shape[0] // HOP_LENGTH
    if n_frames == 0:
        return torch.zeros(n_mels, 0, device=waveform.device)
    padded = F.pad(waveform[None, None], (N_FFT // 2, N_FFT // 2), mode="reflect")[0, 0]
    # Long audio is transformed a block of frames at a time: the same frames, the same numbers, but the
    # complex spectrum of a whole hour never sits in memory at once.
    blocks = []
    for first in range(0, n_frames, MEL_BLOCK_FRAMES):
        last = min(first + MEL_BLOCK_FRAMES, n_frames)  # frames [first, last)
        blocks.append(log_power_block(padded[first * HOP_LENGTH : (last - 1) * HOP_LENGTH + N_FFT], n_mels))
    log_spec = torch.cat(blocks, dim=1) if len(blocks) > 1 else blocks[0]
    return normalise_log_mel(log_spec, log_spec.max())


def log_power_block(samples: torch.Tensor, n_mels: int) -> torch.Tensor:
    """log10 Mel power of consecutive frames, [n_mels, frames], from the ``(frames - 1) * HOP_LENGTH +
    N_FFT`` padded samples under them.

    A streaming reader gives this the same blocks :func:`log_mel_spectrogram` does (frames from a
    multiple of ``MEL_BLOCK_FRAMES``, the same samples), so both get the same bits from transforms of
    the same shape.
    """
    window = torch.hann_window(N_FFT, device=samples.device)
    stft = torch.stft(samples, N_FFT, HOP_LENGTH, window=window, center=False, return_complex=True)
    return torch.clamp(mel_filters(n_mels, samples.device) @ (stft.abs() ** 2), min=1e-10).log10()


def normalise_log_mel(log_spec: torch.Tensor, peak: torch.Tensor) -> torch.Tensor:
    """Clip ``log_spec`` to 80 dB below ``peak`` (the whole padded input's maximum) and rescale."""
    # Keep only the top 80 dB of dynamic range: quieter detail is noise the model never learned from.
    log_spec = torch.maximum(log_spec, peak - 8.0)
    # Shift and scale to roughly [-1, 1], the range the encoder was trained on.
    return (log_spec + 4.0) / 4.0
