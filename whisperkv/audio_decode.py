"""File → samples: the FFmpeg (PyAV) decoding loop behind ``audio.decode_audio`` and
``audio.decode_untrusted``, and the checks that refuse a file it cannot read whole.

A container's audio comes out as consecutive blocks of mono int16 samples at the asked rate, decoded as
they are read. A file that cannot give a complete waveform raises :class:`AudioError` naming it: one
that fails to open or to decode, one with NaN or infinite float samples, and the truncations that can be
proved afterwards (a demuxer's short read, a FLAC or MP3 shorter than its header says).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from typing import BinaryIO

import av
import numpy as np

from whisperkv.audio_formats import DecodeBounds, NestedOpenRefused
from whisperkv.errors import AudioError
from whisperkv.mp3_length import declared_mp3_samples

_FLOAT_FORMATS = {"flt", "fltp", "dbl", "dblp"}
_MP3_TOLERANCE_FRAMES = 4  # a complete MP3 decodes up to ~2 frames short of its count (delay, padding)


def decode_container(
    source: str,
    open_container: Callable[[], av.container.InputContainer],
    reopen: Callable[[], BinaryIO],
    sr: int,
    bounds: DecodeBounds | None,
) -> Iterator[np.ndarray]:
    """The first audio stream of ``open_container()`` as mono int16 blocks at ``sr`` Hz; every error is
    an :class:`AudioError` naming ``source``. ``reopen()`` gives the bytes again from the start, for the
    length checks that read a header; ``bounds`` (uploads) limits packets, frames and length."""
    container = _open(source, open_container)
    with container:
        if not container.streams.audio:
            raise AudioError(source, "no audio stream in file")
        stream = container.streams.audio[0]
        decoded_samples, produced, short_read = yield from _blocks(source, container, stream, sr, bounds)
        _check_complete(source, container, stream, reopen, decoded_samples, short_read)
    if produced == 0:
        raise AudioError(source, "no audio samples")


def _open(
    source: str, open_container: Callable[[], av.container.InputContainer]
) -> av.container.InputContainer:
    """The opened container; why it could not be opened, as an :class:`AudioError`."""
    try:
        return open_container()
    except NestedOpenRefused as e:
        raise AudioError(source, str(e)) from e
    except EOFError as e:  # PyAV's EOFError: the file ends before its header does
        raise AudioError(source, "truncated or corrupt audio (file ends inside the header)") from e
    except OSError as e:  # e.g. permission denied
        raise AudioError(source, f"cannot read file ({_describe(e)})") from e
    except av.FFmpegError as e:  # no demuxer recognises the bytes
        raise AudioError(source, f"not an audio file ({_describe(e)})") from e


def _blocks(
    source: str,
    container: av.container.InputContainer,
    stream: av.AudioStream,
    sr: int,
    bounds: DecodeBounds | None,
) -> Generator[np.ndarray, None, tuple[int, int, bool]]:
    """The stream's samples, resampled, block by block. Returns what the checks after the last block
    need: the samples decoded (at the file's own rate, to compare with what its header promises), the
    samples given out (at ``sr``), and whether the demuxer flagged a short read."""
    resampler = av.AudioResampler(format="s16", layout="mono", rate=sr)
    decoded_samples = 0
    produced = 0
    demuxer_flagged_short_read = False
    try:
        for packet in container.demux(stream):
            demuxer_flagged_short_read |= packet.is_corrupt
            if bounds is not None:
                bounds.check_packet(source, packet)
            for frame in packet.decode():
                if bounds is not None:
                    bounds.check_frame(source, frame)
                if frame.format.name in _FLOAT_FORMATS:
                    # FFmpeg's conversion to int16 turns NaN and infinity into full-scale samples
                    # without a word; refuse them before it sees them.
                    _refuse_non_finite(source, frame, decoded_samples)
                decoded_samples += frame.samples
                for out in resampler.resample(frame):
                    produced += out.samples
                    if bounds is not None:
                        bounds.check_length(source, produced)
                    yield _samples(out)
        # The resampler holds back a few samples for its filter; ask for them explicitly.
        for out in resampler.resample(None):
            produced += out.samples
            if bounds is not None:
                bounds.check_length(source, produced)
            yield _samples(out)
    except NestedOpenRefused as e:
        raise AudioError(source, str(e)) from e
    except (av.FFmpegError, OSError, ValueError) as e:
        # Raised mid-stream, typically by the decoder on a frame cut off by truncation.
        raise AudioError(source, f"truncated or corrupt audio ({_describe(e)})") from e
    return decoded_samples, produced, demuxer_flagged_short_read


def _check_complete(
    source: str,
    container: av.container.InputContainer,
    stream: av.AudioStream,
    reopen: Callable[[], BinaryIO],
    decoded_samples: int,
    demuxer_flagged_short_read: bool,
) -> None:
    """Some truncations decode cleanly to the end of what is there: refuse the ones that can be proved."""
    if demuxer_flagged_short_read and not _wav_length_unknown(reopen):
        # The demuxer asked for bytes the header promised and the file did not have.
        raise AudioError(source, "truncated or corrupt audio (file ends before its header says)")
    rate = stream.codec_context.sample_rate
    if stream.codec_context.name == "flac" and stream.duration:
        # FLAC's STREAMINFO records the exact sample count (FFmpeg leaves duration unset when it is 0).
        declared = round(stream.duration * stream.time_base * rate)
        if decoded_samples < declared:
            raise AudioError(
                source, f"truncated or corrupt audio (decoded {decoded_samples} of {declared} samples)"
            )
    if container.format.name == "mp3" and rate:
        # An MP3's only length field is the frame count of a Xing/Info or VBRI frame, when it has one.
        with reopen() as head:
            declared = declared_mp3_samples(head)
        if declared and declared - decoded_samples > _MP3_TOLERANCE_FRAMES * 1152:
            raise AudioError(
                source,
                f"truncated or corrupt audio (expected {declared / rate:.2f} s from its Xing/VBRI "
                f"header, decoded {decoded_samples / rate:.2f} s)",
            )
    # Not provable: a CBR MP3 without such a frame has no length field (FFmpeg estimates one from the
    # bitrate), and Ogg's length is read from its last complete page, so a cut-off file decodes as
    # shorter audio.


def _refuse_non_finite(source: str, frame: av.AudioFrame, first_sample: int) -> None:
    """Raise AudioError naming the first NaN/infinite sample of a float frame (at the file's rate)."""
    finite = np.isfinite(frame.to_ndarray())
    if finite.all():
        return
    if frame.format.is_planar:  # [channels, samples]
        per_sample = finite.all(axis=0)
    else:  # [1, samples * channels], interleaved
        per_sample = finite.reshape(-1, frame.layout.nb_channels).all(axis=1)
    at = first_sample + int(np.argmin(per_sample))
    raise AudioError(
        source,
        f"non-finite sample (NaN or infinity) at {at / frame.sample_rate:.3f} s (sample {at} of the "
        f"{frame.sample_rate} Hz stream); the file's float samples must be finite numbers",
    )


def _samples(frame: av.AudioFrame) -> np.ndarray:
    """The int16 samples of one packed mono s16 frame, as a flat array."""
    return frame.to_ndarray().reshape(-1)


def _describe(error: Exception) -> str:
    """A short lower-case reason from an FFmpeg/OS error, without errno numbers or file names."""
    text = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return text[0].lower() + text[1:]


_WAV_PLACEHOLDER_SIZE = 0x7FFF0000  # data sizes from here up are "unknown", not a real 2-4 GiB length


def _wav_length_unknown(reopen: Callable[[], BinaryIO]) -> bool:
    """True for a RIFF/WAVE file whose data chunk size is a placeholder rather than a real length.

    Programs that write WAV to a pipe cannot go back and fill in the size, so they leave 0 or a value
    at the limit of a 32-bit field (0xFFFFFFFF, or 0x7FFFFFFF if signed). FFmpeg then reads to the end of the
    file, its last read comes up short, and it flags that packet as corrupt although nothing is missing.
    Only for these files is the flag not evidence of truncation. (The price: a real WAV of 2 GiB or more
    that was cut short is not caught.)
    """
    try:
        with reopen() as f:
            riff = f.read(12)
            if len(riff) < 12 or riff[:4] != b"RIFF" or riff[8:12] != b"WAVE":
                return False
            while len(header := f.read(8)) == 8:
                chunk_id, size = header[:4], int.from_bytes(header[4:], "little")
                if chunk_id == b"data":
                    return size == 0 or size >= _WAV_PLACEHOLDER_SIZE
                f.seek(size + (size & 1), os.SEEK_CUR)  # chunks are padded to an even length
    except OSError:
        pass
    return False
