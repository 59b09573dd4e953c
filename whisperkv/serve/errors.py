"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with the right status.

Every deliberate failure of a request raises :class:`APIError`; the handlers installed by
:func:`install_error_handlers` turn it, FastAPI's validation errors and Starlette's 404/405 into that
shape, so a client never sees a traceback or a framework-specific body; anything else escaping a route
is a generic 500 in that shape, never the exception's own text.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

#: OpenAI's error ``type`` for each status the server uses
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """A request failed on purpose: ``status``, a message naming what is wrong, and the field at fault."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(
        error_body(error.status, error.message, error.param, error.code),
        status_code=error.status,
        headers=error.headers,
    )


def install_error_handlers(app: FastAPI) -> None:
    """Make every error the app returns an OpenAI-shaped JSON body."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_response(APIError(400, f"{param}: {first.get('msg', 'invalid request')}", param=param))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # a bug, not a bad request: the log has the details (Starlette re-raises it to the server), the
        # client a generic 500 without a traceback or the exception's text
        return error_response(APIError(500, "internal server error", code="server_error"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail) if exc.status_code != 404 else f"no route {request.url.path}"
        code = "unknown_url" if exc.status_code == 404 else None
        return error_response(APIError(exc.status_code, message, code=code, headers=exc.headers))
