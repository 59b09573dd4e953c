"""The encoder worker: a FastAPI app that encodes one sealed log-Mel window and answers sealed.

POST /v1/session  JSON hello → JSON answer (the handshake; see ``handshake.py``)
POST /v1/encode   sealed log-Mel window (application/octet-stream) → sealed encoder output or Cross-KV

The worker opens a request only under the key of the session its label names, only for a sequence
number above the last one it served, and checks that the window it opened is what the label says
(digest, shape, dtype, weights). Sessions live in the app's own state (at most ``max_sessions``, the
oldest dropped first); refusals are JSON ``{"error": ...}`` with a 4xx status, never a traceback.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from whisperkv.boundary.associated_data import parse_label
from whisperkv.boundary.costs import stopwatch
from whisperkv.boundary.handshake import parse_hello, worker_answer
from whisperkv.boundary.keys import DIRECTION_REQUEST, DIRECTION_RESPONSE, Measurement, measure
from whisperkv.boundary.protocol import cross_kv_payload, request_label, response_labels
from whisperkv.boundary.replay import WorkerSequence
from whisperkv.boundary.sealing import open_part, read_parts, seal, tensor_bytes, tensor_from_bytes
from whisperkv.cache.provenance import tensor_digest
from whisperkv.errors import SealedCacheError

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper

MAX_REQUEST_BYTES = 8 * 2**20  # a log-Mel window is at most 128 x 3000 x 4 = 1.5 MB


@dataclass
class Session:
    key: bytes
    sequence: WorkerSequence = field(default_factory=WorkerSequence)


@dataclass
class WorkerState:
    """Everything the app holds: the model, the secret, its measurement and the open sessions."""

    model: Whisper
    secret: bytes
    measurement: Measurement
    max_sessions: int = 256
    sessions: OrderedDict[str, Session] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def open_session(self, request_id: str, key: bytes) -> None:
        with self.lock:
            if request_id in self.sessions:
                raise ValueError(f"request id {request_id} already has a session")
            self.sessions[request_id] = Session(key)
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)

    def session(self, request_id: str) -> Session | None:
        with self.lock:
            return self.sessions.get(request_id)


def _refuse(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def encode_window(state: WorkerState, body: bytes) -> tuple[bytes, dict[str, float]]:
    """Open the request, encode (and, for cross_kv, project) the window, seal the answer."""
    model = state.model
    with stopwatch() as open_ms:
        parts = read_parts(body)
        if len(parts) != 1:
            raise SealedCacheError(f"a request holds one part, not {len(parts)}", "parts")
        label = parse_label(parts[0][0])
        session = state.session(label.request_id)
        if session is None:
            raise LookupError(f"no session for request id {label.request_id!r}")
        payload = open_part(session.key, DIRECTION_REQUEST, 0, label, parts[0][1])
        session.sequence.admit(label.seq)
        mel = tensor_from_bytes(payload, label).to(model.device)
        provenance = model.encoder_provenance(mel, label.window_start, label.window_end)
        expected = request_label(model, provenance, label.request_id, label.seq)
        if tensor_digest(mel) != label.mel_digest or expected != label:
            raise SealedCacheError(
                "the window does not match its label (digest, shape, dtype or weights)", "label"
            )
    with stopwatch() as encoder_ms:
        features = model.embed_audio(mel)
    labels = response_labels(model, label, state.measurement.carry)
    with stopwatch() as projection_ms:
        if state.measurement.carry == "features":
            tensors = [features]
        else:
            tensors = [cross_kv_payload(kv) for kv in model.decoder.project_cross_kv(features, provenance)]
    with stopwatch() as seal_ms:
        blob = seal(session.key, DIRECTION_RESPONSE, labels, [tensor_bytes(t) for t in tensors])
    costs = {"open": open_ms[0], "encoder": encoder_ms[0], "projection": projection_ms[0], "seal": seal_ms[0]}
    return blob, costs


def create_app(model: Whisper, secret: bytes, carry: str = "features") -> FastAPI:
    """The worker app for ``model``; ``carry`` says what it sends back (features or cross_kv)."""
    state = WorkerState(model, secret, measure(model, carry))
    app = FastAPI(title="whisperkv encoder worker", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.worker = state

    @app.post("/v1/session")
    async def session(request: Request) -> Response:
        try:
            hello = parse_hello(await request.json())
            key, answer = worker_answer(state.secret, hello, state.measurement)
            state.open_session(hello.request_id, key)
        except ValueError as err:  # includes a body that is not JSON
            return _refuse(400, f"bad handshake: {err}")
        return JSONResponse(answer)

    @app.post("/v1/encode")
    def encode(body: bytes | None = _body_dependency()) -> Response:
        if body is None:
            return _refuse(413, f"request over {MAX_REQUEST_BYTES} bytes")
        try:
            blob, costs = encode_window(state, body)
        except LookupError as err:
            return _refuse(404, str(err.args[0]))
        except SealedCacheError as err:
            status = 409 if err.field == "seq" else 403 if err.field == "authentication" else 400
            return _refuse(status, err.reason)
        headers = {f"x-whisperkv-{name}-ms": f"{ms:.3f}" for name, ms in costs.items()}
        return Response(blob, media_type="application/octet-stream", headers=headers)

    @app.get("/healthz")
    def healthz() -> dict:
        return {
            "status": "ok",
            "carry": state.measurement.carry,
            "weights_digest": state.measurement.weights_digest,
        }

    return app


def _body_dependency():  # noqa: ANN202 - a FastAPI dependency object
    """The raw request body, or None once it passes ``MAX_REQUEST_BYTES`` (reading stops there).

    The endpoint itself stays synchronous (encoding blocks), so FastAPI runs it in its thread pool.
    """
    from fastapi import Depends

    async def read(request: Request) -> bytes | None:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_REQUEST_BYTES:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    return Depends(read)


def run_worker(model: Whisper, secret: bytes, carry: str, host: str = "127.0.0.1", port: int = 8001) -> None:
    """Serve the worker with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(create_app(model, secret, carry), host=host, port=port, log_level="warning")


@contextmanager
def background_worker(app: FastAPI, host: str = "127.0.0.1", start_timeout: float = 30.0) -> Iterator[str]:
    """Serve ``app`` from a thread on a free port of ``host``; yields its URL, stops it on exit.

    For tests and benchmarks that want a worker without a second process.
    """
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="whisperkv-encoder-worker", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError("encoder worker did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
