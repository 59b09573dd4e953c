"""The app factory: one FastAPI app around one model and one scheduler.

``create_app(model, scheduler, settings)`` wires the routers (one module each), the OpenAI error shape,
the upload cap, the body deadline, metrics, the Realtime session count and the shutdown state. Other parts
add their own routers to the returned app (``app.include_router(...)``); everything a route needs is on
``app.state``: ``model``, ``scheduler``, ``settings``, ``metrics``, ``lifecycle``, ``realtime_sessions``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from whisperkv.serve import realtime, routes_audio, routes_meta
from whisperkv.serve.auth import require_api_key
from whisperkv.serve.errors import install_error_handlers
from whisperkv.serve.metrics import ServeMetrics
from whisperkv.serve.openapi_form import server_schema
from whisperkv.serve.realtime_admission import RealtimeSessions
from whisperkv.serve.settings import ServeSettings
from whisperkv.serve.slow_clients import BodyDeadlineMiddleware, client_left
from whisperkv.serve.upload import BodyLimitMiddleware

#: paths whose latency is recorded under their own name (anything else is "other": bounded label values)
KNOWN_PATHS = ("/v1/audio/transcriptions", "/v1/audio/translations", "/v1/models", "/health", "/metrics")


class Lifecycle:
    """Whether the server still takes work. Shutdown = refuse new requests (503), then drain the scheduler."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.shutting_down = False
        self.started_at = int(time.time())
        self._drain_lock = threading.Lock()
        self._drained = False

    def begin_shutdown(self) -> None:
        self.shutting_down = True

    def drain(self) -> None:
        """Refuse new work and block until every submitted job has finished (idempotent)."""
        self.shutting_down = True
        with self._drain_lock:
            if not self._drained:
                self.scheduler.stop(drain=True)
                self._drained = True


class MetricsMiddleware:
    """Counts each HTTP response by endpoint and status and times it until its last byte is sent."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in KNOWN_PATHS else "other"
        started, status = time.perf_counter(), 500

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            self.metrics.observe(endpoint, status, time.perf_counter() - started)


def create_app(model: Any, scheduler: Any, settings: ServeSettings | None = None) -> FastAPI:
    """An app serving ``model`` through ``scheduler`` (started with the app, drained when it stops)."""
    settings = settings or ServeSettings()
    lifecycle = Lifecycle(scheduler)

    mel_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="whisperkv-mel")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        yield
        await run_in_threadpool(lifecycle.drain)
        mel_thread.shutdown(wait=False)

    # no docs pages, the schema behind the key (below), and no trailing-slash redirects: Starlette builds
    # their Location from the client's Host header
    app = FastAPI(
        title="whisperkv",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,
    )
    app.state.model = model
    app.state.scheduler = scheduler
    app.state.settings = settings
    app.state.lifecycle = lifecycle
    # one thread makes every request's first log-Mel (``Job.prepare``), off the scheduler's thread: made in
    # the request threads themselves, each thread's heap kept its STFT's freed buffers (+250 MB peak RSS
    # for sixteen clients, ``benchmarks/serve.py``)
    app.state.mel_thread = mel_thread
    app.state.metrics = ServeMetrics(scheduler.stats)
    app.state.realtime_sessions = RealtimeSessions(settings.realtime_max_sessions)
    install_error_handlers(app)
    app.add_exception_handler(ClientDisconnect, client_left)
    app.include_router(routes_audio.router)
    app.include_router(routes_meta.router)
    app.include_router(realtime.router)

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_api_key)])
    async def openapi(request: Request) -> JSONResponse:
        """The OpenAPI schema, audio forms included (``openapi_form``); needs the key when one is set."""
        return JSONResponse(server_schema(request.app))

    app.add_middleware(BodyLimitMiddleware, limit=settings.max_upload_bytes)
    app.add_middleware(BodyDeadlineMiddleware, timeout_s=settings.body_timeout_s, lifecycle=lifecycle)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app
