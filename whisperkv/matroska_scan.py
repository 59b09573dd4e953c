"""The largest element FFmpeg would read whole from a Matroska/WebM upload, found from the headers alone.

FFmpeg's Matroska demuxer reads each block (a packet) into memory whole before anyone can look at it, and
so it does with a track's codec data and with attachments: an upload of 86 MB holding one block took the
server +355 MB before the packet check refused it (``DecodeBounds.check_packet``). This walk reads only
element headers (an ID and a size each, a few bytes) and skips over contents, so an oversized element is
refused before FFmpeg allocates it. Clusters and block groups no larger than the limit are skipped whole
(their blocks cannot be larger); larger ones, and those of unknown size (live WebM), are entered. Past
bytes that are no element, the walk resumes at the next Cluster ID, as FFmpeg's own resync does.
"""

from __future__ import annotations

import io
import os
from typing import BinaryIO

SEGMENT = 0x18538067
CLUSTER = 0x1F43B675
BLOCK_GROUP = 0xA0
_CLUSTER_BYTES = CLUSTER.to_bytes(4, "big")
#: elements examined before the walk gives up (FFmpeg's own packet check still follows)
MAX_ELEMENTS = 4_000_000


def oversized_element(file: BinaryIO, limit: int) -> tuple[int, int, int] | None:
    """(element ID, declared size, offset) of the first element over ``limit`` bytes that FFmpeg would
    read whole, or None; ``file`` is read from its start, its position left anywhere."""
    end = file.seek(0, os.SEEK_END)
    reader = io.BufferedReader(_Raw(file), buffer_size=1 << 16)
    at, examined = 0, 0
    while at < end and examined < MAX_ELEMENTS:
        examined += 1
        header = _element(reader, at)
        if header is None:  # not an element: resume where the next cluster starts
            at = _next_cluster(reader, at + 1, end)
            continue
        element, size, header_bytes = header
        entered = element == SEGMENT or (element in (CLUSTER, BLOCK_GROUP) and (size is None or size > limit))
        if entered:
            at += header_bytes
        elif size is None:  # an unknown size only a segment or a cluster may have
            at = _next_cluster(reader, at + 1, end)
        elif size > limit:
            return element, size, at
        else:
            at += header_bytes + size
    return None


def _element(reader: io.BufferedReader, at: int) -> tuple[int, int | None, int] | None:
    """The ID, size (None: unknown) and header length of the element at ``at``; None if there is none."""
    reader.seek(at)
    head = reader.read(12)
    id_length = _vint_length(head[0]) if head else 0
    if not 1 <= id_length <= 4 or len(head) < id_length + 1:
        return None
    size_length = _vint_length(head[id_length])
    if not 1 <= size_length <= 8 or len(head) < id_length + size_length:
        return None
    element = int.from_bytes(head[:id_length], "big")
    raw = head[id_length : id_length + size_length]
    size = int.from_bytes(raw, "big") & ((1 << (7 * size_length)) - 1)
    unknown = size == (1 << (7 * size_length)) - 1
    return element, None if unknown else size, id_length + size_length


def _vint_length(first: int) -> int:
    """Bytes of an EBML variable-length integer from its first byte (0: none)."""
    return 9 - first.bit_length() if first else 0


def _next_cluster(reader: io.BufferedReader, at: int, end: int) -> int:
    """The offset of the next Cluster ID at or after ``at`` (``end`` if none)."""
    reader.seek(at)
    carry = b""
    while at < end:
        chunk = reader.read(1 << 16)
        if not chunk:
            break
        window = carry + chunk
        found = window.find(_CLUSTER_BYTES)
        if found >= 0:
            return at - len(carry) + found
        carry = window[-3:]
        at += len(chunk)
    return end


class _Raw(io.RawIOBase):
    """The caller's binary file as a raw stream for ``BufferedReader`` (its own position, its reads)."""

    def __init__(self, file: BinaryIO) -> None:
        super().__init__()
        self._file = file

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        data = self._file.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
