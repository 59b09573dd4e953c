"""The uploaded audio: a request body capped while it is read, and the file part opened only as audio.

The cap is enforced on the byte stream itself (an ASGI middleware counting body chunks), so an oversized
upload is refused after at most ``limit`` bytes were read, whatever its Content-Length claims; nothing is
buffered beyond that (Starlette spools file parts to disk above 1 MiB).

The file part is a stranger's bytes. Its name is never used: the bytes are copied to an anonymous
temporary file and read by the one demuxer their magic bytes call for, out of an allow-list of audio
formats (:mod:`whisperkv.audio_formats`), with no protocol and no nested open, so a playlist or concat
list cannot make the server read its own disk whatever it is called. Decoding stops as soon as the
audio passes ``--max_audio_s``, and an upload longer than a minute is read window by window (a
:class:`~whisperkv.audio_source.FileSource`), so memory stays bounded whatever the compression ratio.
That one decoding pass keeps a long upload's samples in an anonymous spool file
(:mod:`whisperkv.audio_spool`, up to ``SPOOL_PER_UPLOAD_BYTE`` times ``--max_upload_mb``), which the
windows are read from: decoded once. Longer audio than the spool holds is decoded again from the copy.
The samples are those ``load_audio`` gives the CLI for the same bytes, so a transcript over HTTP starts
from the very waveform ``transcribe(path)`` would.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
from starlette.datastructures import UploadFile
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from whisperkv.audio import SAMPLE_RATE, decode_untrusted, int16_to_float
from whisperkv.audio_formats import AudioTooLongError, UnsupportedUpload, sniff_audio_format
from whisperkv.audio_source import IN_MEMORY_SECONDS, AudioSource, FileSource
from whisperkv.audio_spool import PcmSpool
from whisperkv.errors import AudioError
from whisperkv.serve.errors import APIError, error_body

#: room for the form fields and multipart boundaries around the file, on top of the file limit
FORM_OVERHEAD_BYTES = 64 * 1024
#: a long upload's decoded samples are spooled up to this many times the upload limit (100 MB: 1 h 49 min
#: of audio); the request then holds that file on disk instead of its upload's copy
SPOOL_PER_UPLOAD_BYTE = 2
#: the most one read of the upload's copy returns (FFmpeg reads again for the rest)
READ_CHUNK_BYTES = 2**20


def too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"upload too large: the limit is {limit / 2**20:g} MB (--max_upload_mb)",
        param="file",
        code="upload_too_large",
    )


class BodyLimitMiddleware:
    """Refuse a request body longer than ``limit + FORM_OVERHEAD_BYTES``: up front when its
    Content-Length says so, else as soon as the count passes it (``receive`` raises a 413 APIError)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.cap = limit + FORM_OVERHEAD_BYTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.cap:
            await _send_json(
                send, 413, error_body(413, too_large(self.limit).message, "file", "upload_too_large")
            )
            return
        seen = 0

        async def counted_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.cap:
                    raise too_large(self.limit)
            return message

        await self.app(scope, counted_receive, send)


async def _send_json(send: Send, status: int, body: dict) -> None:
    import json

    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def open_upload(upload: UploadFile, limit: int, max_audio_s: float, n_mels: int) -> np.ndarray | AudioSource:
    """The upload as audio: its 16 kHz mono waveform when it lasts up to ``IN_MEMORY_SECONDS``, else a
    source that reads it window by window, its length and log-Mel peak already found (blocking: run it
    in a worker thread).

    Raises APIError 413 when the file is over ``limit`` bytes or its audio over ``max_audio_s`` seconds,
    and 400 when it is empty, not one of the accepted audio formats, or not decodable.
    """
    name = upload.filename or "upload"
    upload.file.seek(0, os.SEEK_END)
    size = upload.file.tell()
    upload.file.seek(0)
    if size > limit:
        raise too_large(limit)
    if size == 0:
        raise APIError(400, f"{name}: empty file", param="file", code="invalid_audio")
    try:
        sniffed = sniff_audio_format(upload.file)
    except UnsupportedUpload as err:
        raise APIError(400, f"{name}: {err}", param="file", code="invalid_audio") from None
    copy = UploadCopy(upload.file, size)
    max_samples = int(max_audio_s * SAMPLE_RATE)

    def decode() -> Iterator[np.ndarray]:
        return decode_untrusted(copy.reader, name, sniffed, max_samples=max_samples)

    try:
        # a first pass decodes it all without a log-Mel: the limit is checked at decoding speed (a bomb
        # of silence is refused in a second or two), a short upload's waveform is kept, a long one's spooled
        spool = PcmSpool(SPOOL_PER_UPLOAD_BYTE * limit)
        waveform = _first_pass(decode(), int(IN_MEMORY_SECONDS * SAMPLE_RATE), spool)
        if waveform is not None:
            return waveform
        source = FileSource.over(name, spool.blocks if spool.complete else decode, n_mels)
        source.n_samples  # noqa: B018 - its own pass, once: the length and the log-Mel peak
        return source
    except AudioTooLongError:
        raise APIError(
            413,
            f"{name}: the audio is longer than this server's limit of {max_audio_s:g} s (--max_audio_s)",
            param="file",
            code="audio_too_long",
        ) from None
    except AudioError as err:
        raise APIError(400, f"{name}: {err.reason}", param="file", code="invalid_audio") from None


def _first_pass(blocks: Iterator[np.ndarray], most: int, spool: PcmSpool) -> np.ndarray | None:
    """Decode every block (the decoder refusing too long audio as it goes); the whole waveform if it
    ends within ``most`` samples, else None, with every sample in ``spool`` unless it went over its cap
    (only ``most`` samples were ever kept in memory)."""
    kept: list[np.ndarray] | None = []
    total = 0
    for block in blocks:
        total += len(block)
        if kept is not None and total > most:
            for earlier in kept:
                spool.append(earlier)
            kept = None
        if kept is not None:
            kept.append(block)
        else:
            spool.append(block)
    if kept is not None:
        spool.drop()  # a short upload: its waveform is in memory
        return int16_to_float(np.concatenate(kept))
    spool.finish()
    return None


class UploadCopy:
    """The upload's bytes in a temporary file that has no name at all (gone when this is), read through
    any number of independent readers: each decode pass, and the checks after one, keep their own
    position."""

    def __init__(self, file: BinaryIO, size: int) -> None:
        self._file = tempfile.TemporaryFile(prefix="whisperkv-upload-")
        file.seek(0)
        shutil.copyfileobj(file, self._file, 1024 * 1024)
        self._file.flush()
        self.size = size

    def reader(self) -> BinaryIO:
        return _PositionalReader(self, self._file.fileno(), self.size)


class _PositionalReader(io.RawIOBase):
    """A read-only view of a file descriptor with its own offset (``os.pread``), holding its owner."""

    def __init__(self, owner: UploadCopy, fd: int, size: int) -> None:
        super().__init__()
        self._owner = owner  # keeps the temporary file open while a reader exists
        self._fd = fd
        self._size = size
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        """At most ``READ_CHUNK_BYTES`` a call: FFmpeg reads a large packet straight into its own buffer
        with one read of the packet's size, and ``RawIOBase.read`` would hold that size twice more."""
        return super().read(size if size is None or size < 0 else min(size, READ_CHUNK_BYTES))

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        data = os.pread(self._fd, min(len(buffer), max(0, self._size - self._at)), self._at)
        buffer[: len(data)] = data
        self._at += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._at, os.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError("seek before the start of the upload")
        self._at = base + offset
        return self._at

    def tell(self) -> int:
        return self._at
