"""API key check: when the server has a key, every ``/v1`` route and ``/metrics`` needs ``Bearer KEY``.

The key is compared in constant time; ``/health`` stays open so a load balancer can probe it.
"""

from __future__ import annotations

import secrets

from fastapi import Request

from whisperkv.serve.errors import APIError


def require_api_key(request: Request) -> None:
    """FastAPI dependency: 401 in OpenAI's shape when a key is set and the request lacks it or has another."""
    expected: str | None = request.app.state.settings.api_key
    if not expected:
        return
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise APIError(
            401,
            "missing API key: send the header 'Authorization: Bearer KEY'",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not secrets.compare_digest(given.strip().encode(), expected.encode()):
        raise APIError(
            401, "incorrect API key provided", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
        )
