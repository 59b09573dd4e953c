"""What the long-form loop reads from its audio: its length, exact log-Mel frames, and raw samples.

The loop never needs the whole waveform or spectrogram at once — only the frames of the window it is
about to encode and the samples under it (to skip digital silence). Keeping that behind one small
interface lets a source hold everything in memory (an array given by the caller) or read a file
window by window, and the loop cannot tell the difference: both give the same numbers, bit for bit.

The log-Mel is the one ``log_mel_spectrogram(audio, n_mels, padding=N_SAMPLES)`` computes, so frame
``content_frames`` onwards is the 30 s of zero padding that completes the last window.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

import av
import numpy as np
import torch

from whisperkv.audio import (
    HOP_LENGTH,
    MEL_BLOCK_FRAMES,
    N_FFT,
    N_SAMPLES,
    SAMPLE_RATE,
    decode_audio,
    int16_to_float,
    load_audio,
    log_mel_spectrogram,
    log_power_block,
    normalise_log_mel,
)
from whisperkv.audio_spool import SPOOL_MAX_BYTES, PcmSpool
from whisperkv.errors import AudioError


@runtime_checkable
class AudioSource(Protocol):
    """A 16 kHz mono recording as the long-form loop reads it."""

    name: str  # what error messages call it: a path, or "<array>"

    @property
    def n_samples(self) -> int:
        """Length of the audio, in samples."""
        ...

    @property
    def content_frames(self) -> int:
        """Log-Mel frames that hold audio (100 per second); the padding follows them."""
        ...

    def mel(self, start: int, stop: int) -> torch.Tensor:
        """Log-Mel frames [start, stop) as [n_mels, stop - start] (stop ≤ content_frames + 3000)."""
        ...

    def samples(self, start: int, stop: int) -> torch.Tensor:
        """Waveform samples [start, stop) (clipped to the audio; start ≥ 0), float32."""
        ...


class InMemorySource:
    """The whole waveform held in memory (its padded log-Mel made on first use): for arrays a caller holds."""

    def __init__(self, audio: np.ndarray | torch.Tensor, n_mels: int, name: str = "<array>") -> None:
        if isinstance(audio, np.ndarray):
            audio = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
        if audio.ndim != 1:
            raise AudioError(name, f"expected a 1-D waveform, got shape {tuple(audio.shape)}")
        if audio.numel() == 0:
            raise AudioError(name, "no audio samples")
        finite = torch.isfinite(audio)
        if not bool(finite.all()):  # NaN or infinity would reach the decoder as NaN probabilities
            at = int(torch.argmin(finite.to(torch.uint8)))
            raise AudioError(
                name,
                f"non-finite sample ({float(audio[at])}) at sample {at} ({at / SAMPLE_RATE:.3f} s); "
                "audio must be finite numbers",
            )
        self.name = name
        self.audio = audio
        self._n_mels = n_mels
        self._log_mel: torch.Tensor | None = None

    @property
    def n_samples(self) -> int:
        return int(self.audio.numel())

    @property
    def content_frames(self) -> int:
        return self.n_samples // HOP_LENGTH

    def mel(self, start: int, stop: int) -> torch.Tensor:
        if self._log_mel is None:
            self._log_mel = log_mel_spectrogram(self.audio, self._n_mels, padding=N_SAMPLES)
        return self._log_mel[:, start:stop]

    def samples(self, start: int, stop: int) -> torch.Tensor:
        return self.audio[start:stop]


_PAD = N_FFT // 2  # the STFT's centring: padded sample p is waveform sample p - _PAD
_BLOCK = MEL_BLOCK_FRAMES
_KEEP_BEHIND = _BLOCK * HOP_LENGTH + _PAD  # samples kept before the latest request: one Mel block's worth
_CACHED_BLOCKS = 3  # log-Mel blocks of 60 s kept (a 30 s window spans at most two)


class FileSource:
    """A file read window by window: memory stays the same however long the recording is.

    A first pass decodes the whole file once for what no window can know alone: its length, and the
    log-Mel maximum the reference clips every frame's dynamic range against. It keeps the samples it
    decodes in a spool on disk (``audio_spool.PcmSpool``, up to ``spool_bytes``), and the windows are
    then read from the spool: the file is decoded once. Audio longer than the spool is decoded a second
    time for the windows. Either way the windows are served moving forward with the loop, keeping about
    a minute of samples behind the latest request and the last few 60 s log-Mel blocks; a request
    further back reads again from the start (``rewinds`` counts how often). The frames are computed in
    the same blocks and the same way as :func:`log_mel_spectrogram`, so they are the same bits.
    """

    def __init__(self, path: str | os.PathLike, n_mels: int, spool_bytes: int = SPOOL_MAX_BYTES) -> None:
        self._setup(str(path), n_mels, lambda: decode_audio(path), lambda: _stamp(path), spool_bytes)

    @classmethod
    def over(
        cls, name: str, decode: Callable[[], Iterator[np.ndarray]], n_mels: int, spool_bytes: int = 0
    ) -> FileSource:
        """A source over audio that cannot change while read (a server's copy of an upload, or a complete
        spool's ``blocks``): each ``decode()`` yields its int16 blocks from the start, as
        :func:`~whisperkv.audio.decode_audio` does."""
        source = cls.__new__(cls)
        source._setup(name, n_mels, decode, None, spool_bytes)
        return source

    def _setup(
        self,
        name: str,
        n_mels: int,
        decode: Callable[[], Iterator[np.ndarray]],
        stamp: Callable[[], tuple[int, int]] | None,
        spool_bytes: int,
    ) -> None:
        self.name = name
        self.decodes = 0  # passes through ``decode``: the first; then one per restart without a spool

        def counted() -> Iterator[np.ndarray]:
            self.decodes += 1
            return decode()

        self._decode: Callable[[], Iterator[np.ndarray]] = counted
        self._n_mels = n_mels
        self._spool = PcmSpool(spool_bytes) if spool_bytes > 0 else None
        blocks = counted()  # checks the file exists and is one
        self._stream = _SampleStream(self._spool.tap(blocks) if self._spool is not None else blocks)
        self._stamp_now = stamp
        self._stamp = stamp() if stamp is not None else None
        self._n_samples: int | None = None
        self._peak: torch.Tensor | None = None
        self._blocks: OrderedDict[int, torch.Tensor] = OrderedDict()  # block index -> log10 Mel power
        self.rewinds = 0

    @property
    def n_samples(self) -> int:
        if self._n_samples is None:
            self._scan()
        assert self._n_samples is not None
        return self._n_samples

    @property
    def content_frames(self) -> int:
        return self.n_samples // HOP_LENGTH

    def samples(self, start: int, stop: int) -> torch.Tensor:
        if self._n_samples is not None:
            stop = min(stop, self._n_samples)
        waveform = self._read(start, max(start, stop))
        self._stream.forget_before(start - _KEEP_BEHIND)
        return torch.from_numpy(int16_to_float(waveform))

    def mel(self, start: int, stop: int) -> torch.Tensor:
        if self._peak is None:
            self._scan()
        assert self._peak is not None
        stop = min(stop, self.content_frames + N_SAMPLES // HOP_LENGTH)
        if start >= stop:
            return torch.zeros(self._n_mels, 0)
        parts = []
        for index in range(start // _BLOCK, (stop - 1) // _BLOCK + 1):
            first = index * _BLOCK
            block = self._block(index)
            parts.append(block[:, max(start, first) - first : min(stop, first + block.shape[1]) - first])
        log_spec = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        return normalise_log_mel(log_spec, self._peak)

    # --- internals --------------------------------------------------------------------------------------

    def _scan(self) -> None:
        """First pass: decode everything once, for the length and the log-Mel maximum."""
        peak: torch.Tensor | None = None
        index = 0
        while self._n_samples is None or index * _BLOCK < self._total_frames():
            block = self._log_power(index)
            peak = block.max() if peak is None else torch.maximum(peak, block.max())
            self._stream.forget_before((index + 1) * _BLOCK * HOP_LENGTH - _PAD)
            index += 1
        self._peak = peak
        if self._spool is not None and self._spool.complete:  # the windows read what the scan decoded
            self._decode, self._stamp_now = self._spool.blocks, None
        elif self._spool is not None:
            self._spool = None  # over its cap (dropped) or not read from the start: decode again
        self._restart()  # the windows are served from the start again

    def _total_frames(self) -> int:
        """Frames of the padded log-Mel: the audio's and 30 s of zero padding's."""
        assert self._n_samples is not None
        return (self._n_samples + N_SAMPLES) // HOP_LENGTH

    def _block(self, index: int) -> torch.Tensor:
        """Block ``index`` of log10 Mel power, from the cache or computed (and cached)."""
        if index in self._blocks:
            self._blocks.move_to_end(index)
            return self._blocks[index]
        block = self._log_power(index)
        self._blocks[index] = block
        while len(self._blocks) > _CACHED_BLOCKS:
            self._blocks.popitem(last=False)
        return block

    def _log_power(self, index: int) -> torch.Tensor:
        """log10 Mel power of frames [index * _BLOCK, ...) as log_mel_spectrogram's block ``index``."""
        first = index * _BLOCK
        lo = first * HOP_LENGTH - _PAD  # waveform sample under padded sample first * HOP_LENGTH
        hi = lo + (_BLOCK - 1) * HOP_LENGTH + N_FFT
        # Past the audio come the 30 s of zero padding (and the reflection of zeros at the very end).
        waveform = self._read(max(lo, 0), hi)
        extended = np.zeros(hi - max(lo, 0), dtype=np.float32)
        extended[: len(waveform)] = int16_to_float(waveform)
        samples = torch.from_numpy(extended)
        if lo < 0:  # the start is reflect-padded: padded[p] = waveform[_PAD - p]
            samples = torch.cat([samples[1 : _PAD + 1].flip(0), samples])
        last = first + _BLOCK
        if self._n_samples is not None:
            last = min(last, self._total_frames())
        return log_power_block(samples[: (last - first - 1) * HOP_LENGTH + N_FFT], self._n_mels)

    def _read(self, start: int, stop: int) -> np.ndarray:
        """int16 samples [start, stop) (fewer at the end), decoding again from the start if need be."""
        if start < self._stream.start:
            self.rewinds += 1
            self._restart()
        if self._stream.unread and self._stamp_now is not None and self._stamp_now() != self._stamp:
            raise AudioError(self.name, "the file changed while it was being read")
        waveform = self._stream.read(start, stop)
        if self._stream.total is not None:
            if self._n_samples is not None and self._stream.total != self._n_samples:
                raise AudioError(self.name, "the file changed while it was being read")
            self._n_samples = self._stream.total
        return waveform

    def _restart(self) -> None:
        self._stream.close()
        self._stream = _SampleStream(self._decode())


class _SampleStream:
    """A file's int16 samples decoded forward on demand, keeping only those not yet forgotten."""

    def __init__(self, blocks: Iterator[np.ndarray]) -> None:
        self._blocks = blocks
        self.start = 0  # sample index of buffer[0]
        self.buffer = np.zeros(0, dtype=np.int16)
        self.total: int | None = None  # the file's length, once decoded to the end
        self.unread = True  # nothing decoded yet (the file is opened on the first read)

    def read(self, start: int, stop: int) -> np.ndarray:
        """Samples [start, stop), start ≥ self.start; fewer when the file ends first."""
        end = self.start + len(self.buffer)
        self.unread = False
        if stop > end and self.total is None:
            pending = [self.buffer]
            for block in self._blocks:
                pending.append(block)
                end += len(block)
                if end >= stop:
                    break
            else:
                self.total = end
            self.buffer = np.concatenate(pending)
        return self.buffer[max(0, start - self.start) : max(0, stop - self.start)]

    def forget_before(self, index: int) -> None:
        drop = min(index - self.start, len(self.buffer))
        if drop > 0:
            self.buffer = self.buffer[drop:]
            self.start += drop

    def close(self) -> None:
        close = getattr(self._blocks, "close", None)
        if close is not None:
            close()


# Up to this length a file is decoded into memory: one pass instead of two (reading window by window
# costs a second decode and log-Mel). Holding a minute costs ~40 MB more than streaming it (5 min: ~100 MB).
IN_MEMORY_SECONDS = 60.0


def _longer_than(path: str | os.PathLike, seconds: float) -> bool:
    """Whether the container says the file lasts more than ``seconds`` (or cannot say: then stream it)."""
    try:
        with av.open(os.fspath(path)) as container:
            duration = container.duration  # microseconds; an estimate for some formats (CBR MP3)
    except (av.FFmpegError, OSError, EOFError):
        return False  # the in-memory path's decode reports what is wrong with the file
    return duration is None or duration / 1e6 > seconds


def _stamp(path: str | os.PathLike) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns


def open_source(
    audio: str | os.PathLike | np.ndarray | torch.Tensor | AudioSource, n_mels: int
) -> AudioSource:
    """An ``AudioSource`` for a path, a waveform, or a source the caller built.

    A regular file is read window by window; anything else given by path (a pipe, a device) can only
    be read once, so it is decoded into memory.
    """
    if isinstance(audio, (FileSource, InMemorySource)):  # (the protocol check would read properties)
        return audio
    if isinstance(audio, AudioSource):
        return audio
    if isinstance(audio, (str, os.PathLike)):
        if Path(audio).is_file() and _longer_than(audio, IN_MEMORY_SECONDS):
            return FileSource(audio, n_mels)
        return InMemorySource(load_audio(audio), n_mels, name=str(audio))
    return InMemorySource(audio, n_mels)
