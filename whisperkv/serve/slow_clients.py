"""Clients that send slowly or leave: a deadline on the request body, the body's read given up at shutdown,
and a disconnect logged as one line.

uvicorn has no body-read timeout: a client sending one byte every few seconds held a connection (and a
SIGTERM'd server) for as long as it liked. Here the whole body must arrive within ``body_timeout_s`` of the
request's start (a 408), and once shutdown begins a body still being read is answered 503 at once (a job
submitted after it would be refused anyway). Both answers close the connection, so the rest of a trickle is
never read. Only the body is timed: a route that then waits for its job watches ``receive`` untimed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from whisperkv.serve.errors import APIError

log = logging.getLogger("uvicorn.error")  # where the server already logs, at its level

#: how often a body read looks at the clock and the server's state (seconds)
POLL_S = 0.25
#: what a client sees in the log's one line when it left (nginx's "client closed request")
CLIENT_CLOSED = 499


class BodyDeadlineMiddleware:
    """``receive`` with a deadline for the body: a 408 past ``timeout_s``, a 503 once shutting down."""

    def __init__(self, app: ASGIApp, timeout_s: float, lifecycle: Any) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.lifecycle = lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        body_done = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            while True:
                if self.lifecycle.shutting_down:
                    raise APIError(
                        503,
                        "the server is shutting down; the request body was not read to its end",
                        code="shutting_down",
                        headers={"Connection": "close"},
                    )
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise APIError(
                        408,
                        f"the request body did not arrive within {self.timeout_s:g} s (--body_timeout)",
                        code="body_timeout",
                        headers={"Connection": "close"},
                    )
                try:
                    message = await asyncio.wait_for(receive(), min(remaining, POLL_S))
                except asyncio.TimeoutError:
                    continue
                body_done = message["type"] != "http.request" or not message.get("more_body", False)
                return message

        await self.app(scope, timed_receive, send)


async def client_left(request: Request, exc: ClientDisconnect) -> Response:
    """Exception handler: the client closed the connection while its request was read. One log line, an
    answer nobody reads (logged by uvicorn's access log as 499)."""
    client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
    log.info(
        "%s closed the connection before its request was read (%s %s)",
        client,
        request.method,
        request.url.path,
    )
    return Response(status_code=CLIENT_CLOSED)
