"""Who may open a Realtime session: the API key, the server's state, the intent and the session cap, all
checked before the WebSocket handshake completes.

A refused client never gets a WebSocket: it gets an HTTP answer to its upgrade request (401 without the
key, 400 for another intent, 503 while shutting down or when ``realtime_max_sessions`` are open), with
OpenAI's error body, through ASGI's WebSocket Denial Response; a server without that extension closes the
handshake instead (HTTP 403 at the client).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from fastapi import WebSocket
from starlette.responses import JSONResponse

from whisperkv.serve.errors import error_body


class RealtimeSessions:
    """How many Realtime sessions are open, against the cap. The event loop alone touches it: a check and
    its increment have no ``await`` between them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def try_open(self) -> bool:
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def close(self) -> None:
        self.open = max(self.open - 1, 0)


@dataclass(frozen=True)
class Refusal:
    status: int
    code: str
    message: str
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _key_refusal(websocket: WebSocket) -> Refusal | None:
    settings = getattr(websocket.app.state, "settings", None)
    expected = getattr(settings, "api_key", None)
    if not expected:
        return None
    scheme, _, given = websocket.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and secrets.compare_digest(given.strip().encode(), expected.encode()):
        return None
    return Refusal(
        401,
        "invalid_api_key",
        "missing or incorrect API key: send 'Authorization: Bearer KEY'",
        headers={"WWW-Authenticate": "Bearer"},
    )


def refusal(websocket: WebSocket, intent: str | None) -> Refusal | None:
    """Why this connection may not start, or None: the key first, then the state, the intent."""
    refused = _key_refusal(websocket)
    if refused is not None:
        return refused
    lifecycle = getattr(websocket.app.state, "lifecycle", None)
    if lifecycle is not None and lifecycle.shutting_down:
        return Refusal(503, "shutting_down", "the server is shutting down; retry on another instance")
    if intent != "transcription":
        return Refusal(400, "unsupported_intent", "only ?intent=transcription is served here", "intent")
    return None


def sessions_full(limit: int) -> Refusal:
    return Refusal(
        503,
        "too_many_sessions",
        f"the server holds its limit of {limit} Realtime sessions (--realtime_sessions); retry later",
        headers={"Retry-After": "1"},
    )


async def deny(websocket: WebSocket, refused: Refusal) -> None:
    """Answer the upgrade request with an HTTP error instead of a WebSocket."""
    body = error_body(refused.status, refused.message, refused.param, refused.code)
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        response = JSONResponse(body, status_code=refused.status, headers=refused.headers)
        await websocket.send_denial_response(response)
    else:
        await websocket.close(code=1008)
