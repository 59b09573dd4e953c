"""The uploaded audio: a request body capped while it is read, and the file part decoded to a waveform.

The cap is enforced on the byte stream itself (an ASGI middleware counting body chunks), so an oversized
upload is refused after at most ``limit`` bytes were read, whatever its Content-Length claims; nothing is
buffered beyond that (Starlette spools file parts to disk above 1 MiB). The file part is then written to
a temporary file and decoded by the same ``load_audio`` the CLI uses, so a transcript over HTTP starts
from the very waveform ``transcribe(path)`` would.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
from starlette.datastructures import UploadFile
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from whisperkv.audio import load_audio
from whisperkv.errors import AudioError
from whisperkv.serve.errors import APIError, error_body

#: room for the form fields and multipart boundaries around the file, on top of the file limit
FORM_OVERHEAD_BYTES = 64 * 1024


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


def decode_upload(upload: UploadFile, limit: int) -> np.ndarray:
    """The upload's 16 kHz mono waveform (blocking: run it in a worker thread).

    Raises APIError 413 when the file is over ``limit`` bytes and 400 when it is empty or not audio.
    """
    name = upload.filename or "upload"
    upload.file.seek(0, os.SEEK_END)
    size = upload.file.tell()
    upload.file.seek(0)
    if size > limit:
        raise too_large(limit)
    if size == 0:
        raise APIError(400, f"{name}: empty file", param="file", code="invalid_audio")
    suffix = os.path.splitext(name)[1][:16]  # a hint for the demuxer, as the CLI's file name is
    with tempfile.NamedTemporaryFile(prefix="whisperkv-upload-", suffix=suffix) as copy:
        shutil.copyfileobj(upload.file, copy, 1024 * 1024)
        copy.flush()
        try:
            waveform = load_audio(copy.name)
        except AudioError as err:
            raise APIError(400, f"{name}: {err.reason}", param="file", code="invalid_audio") from None
    return waveform
