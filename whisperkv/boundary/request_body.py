"""Reading a request body at the worker: bounded in size and in time, a disconnect one log line.

Every route reads its body through ``read_body``: a declared or streamed body over the route's limit
stops being read at the limit (413), one that does not arrive whole within ``deadline_s`` is cut off
(408), and a client that goes away mid-upload is logged as one line, never a traceback. JSON bodies
are parsed by ``load_json``, which turns every parse failure (deep nesting included) into a ValueError.
"""

from __future__ import annotations

import asyncio
import json
import logging

from starlette.requests import ClientDisconnect, Request

#: how long a whole request body may take to arrive
BODY_DEADLINE_S = 30.0

log = logging.getLogger("whisperkv.boundary.worker")


class BodyRefused(Exception):
    """The body was not read: ``status`` (413, 408) and a message for the JSON error answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ClientGone(Exception):
    """The client disconnected before its body was whole; nothing can be answered."""


async def read_body(request: Request, limit: int, deadline_s: float = BODY_DEADLINE_S) -> bytes:
    """The body of ``request``, at most ``limit`` bytes, whole within ``deadline_s`` seconds."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyRefused(413, f"request over {limit} bytes")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    chunks, size = [], 0
    stream = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), max(0.0, deadline - loop.time()))
        except StopAsyncIteration:
            return b"".join(chunks)
        except asyncio.TimeoutError:
            raise BodyRefused(408, f"request body not received within {deadline_s:g} s") from None
        except ClientDisconnect:
            client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
            log.warning(
                "encoder worker: %s disconnected during %s after %d bytes", client, request.url.path, size
            )
            raise ClientGone() from None
        size += len(chunk)
        if size > limit:
            raise BodyRefused(413, f"request over {limit} bytes")
        chunks.append(chunk)


def load_json(body: bytes) -> object:
    """The JSON value of ``body``; anything that is not UTF-8 JSON of modest depth is a ValueError."""
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError("the body is not JSON") from None
