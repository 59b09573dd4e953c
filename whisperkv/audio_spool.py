"""Decoded samples kept on disk, so a long recording is decoded once and still read in bounded memory.

A file read window by window needs two passes: one over the whole recording (its length, and the log-Mel
maximum every frame is clipped against) before the first window, then the windows. Decoding the file again
for the second pass costs as much as the first (FLAC: 0.14 s for 229.5 s of audio here; MP3 more), and a
server that first checks an upload's length decoded it a third time. Instead, the first pass writes the
16 kHz int16 samples it decodes to an anonymous temporary file (32 KB per second of audio), and every
later pass reads them back: the same samples, bit for bit, in any number of independent readers.

The spool has a cap: past it the file is dropped and the caller decodes again as before, so the disk a
recording takes stays bounded (the server's cap is tied to its upload limit; the CLI's is
``SPOOL_MAX_BYTES``). Memory is unchanged: blocks pass through on their way to the file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator

import numpy as np

#: the CLI's cap: 256 MiB of 16-bit samples at 16 kHz, 2 h 19 min of audio (longer files decode twice)
SPOOL_MAX_BYTES = 256 * 2**20
#: samples per block read back (4.1 s)
READ_BLOCK = 2**16


class PcmSpool:
    """int16 samples appended while decoding, read back from the start any number of times."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.samples = 0
        self.complete = False  # every sample of the recording is in the file
        self.dropped = max_bytes <= 0  # over the cap (or no spool at all): nothing is kept
        self._file: tempfile._TemporaryFileWrapper | None = None  # made by the first block

    def append(self, block: np.ndarray) -> None:
        """Add ``block`` (int16); past the cap the file is dropped and nothing more is kept."""
        if self.dropped:
            return
        if (self.samples + len(block)) * 2 > self.max_bytes:
            self.drop()
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="whisperkv-pcm-")
        self._file.write(np.ascontiguousarray(block, dtype=np.int16).tobytes())
        self.samples += len(block)

    def finish(self) -> None:
        """Every sample is in: the spool can be read back (unless it went over its cap)."""
        if self.dropped:
            return
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="whisperkv-pcm-")  # no samples at all
        self._file.flush()
        self.complete = True

    def tap(self, blocks: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """Yield ``blocks`` unchanged, keeping each; the spool is complete once they are exhausted."""
        for block in blocks:
            self.append(block)
            yield block
        self.finish()

    def blocks(self) -> Iterator[np.ndarray]:
        """The kept samples from the start, as a decoder yields them (a new, independent reader)."""
        if not self.complete or self._file is None:
            raise RuntimeError("the spool is not complete")  # a caller's mistake, never a user's
        fd, at, end = self._file.fileno(), 0, self.samples * 2
        while at < end:
            data = os.pread(fd, min(READ_BLOCK * 2, end - at), at)
            if not data:
                raise OSError("the spool file ended early")
            at += len(data)
            yield np.frombuffer(data, dtype=np.int16)

    def drop(self) -> None:
        """Delete the file now and keep nothing more (the file goes anyway when the spool is garbage)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self.complete, self.dropped = False, True
