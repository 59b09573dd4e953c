"""``decode_audio``: faster-whisper's reader, with whisperkv's decoding and its errors.

A mono path goes through ``whisperkv.load_audio`` (the exact samples every whisperkv path decodes, with its
checks for truncated files). A file-like object, or ``split_stereo``, is decoded here through PyAV the
same way: int16 samples at ``sampling_rate``, scaled to float32; a bad input is an ``AudioError`` naming it.
"""

from __future__ import annotations

import os
from typing import BinaryIO

import av
import numpy as np

from whisperkv.audio import int16_to_float, load_audio
from whisperkv.errors import AudioError


def decode_audio(
    input_file: str | os.PathLike | BinaryIO, sampling_rate: int = 16000, split_stereo: bool = False
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """The audio as float32 at ``sampling_rate``; with ``split_stereo`` a (left, right) pair."""
    if not isinstance(sampling_rate, int) or not 1000 <= sampling_rate <= 384000:
        raise ValueError(f"sampling_rate must be an integer from 1000 to 384000 Hz, got {sampling_rate!r}")
    if isinstance(input_file, (str, os.PathLike)) and not split_stereo:
        return load_audio(input_file, sampling_rate)
    name = os.fspath(input_file) if isinstance(input_file, (str, os.PathLike)) else _name(input_file)
    samples = _decode_int16(input_file, name, sampling_rate, "stereo" if split_stereo else "mono")
    audio = int16_to_float(samples)
    if split_stereo:
        return audio[0::2].copy(), audio[1::2].copy()
    return audio


def _name(file: BinaryIO) -> str:
    return str(getattr(file, "name", None) or f"<{type(file).__name__}>")


def _decode_int16(file: str | os.PathLike | BinaryIO, name: str, rate: int, layout: str) -> np.ndarray:
    """Interleaved int16 samples of the first audio stream, resampled to ``rate`` and ``layout``."""
    if isinstance(file, (str, os.PathLike)):
        if not os.path.isfile(file):
            raise AudioError(name, "file not found")
        file = os.fspath(file)
    resampler = av.AudioResampler(format="s16", layout=layout, rate=rate)
    blocks: list[np.ndarray] = []
    try:
        with av.open(file, mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise AudioError(name, "no audio stream in file")
            for frame in container.decode(audio=0):
                blocks.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(frame))
            blocks.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(None))
    except AudioError:
        raise
    except EOFError as e:
        raise AudioError(name, "truncated or corrupt audio (file ends inside the header)") from e
    except (av.FFmpegError, OSError, ValueError) as e:
        raise AudioError(name, f"not a readable audio file ({type(e).__name__}: {e})") from e
    if not blocks or sum(len(b) for b in blocks) == 0:
        raise AudioError(name, "no audio samples")
    return np.concatenate(blocks)
