"""The encoder worker: a FastAPI app that encodes one sealed log-Mel window and answers sealed.

POST /v1/session        authenticated JSON hello → JSON answer (the handshake; see ``handshake.py``)
POST /v1/encode         sealed log-Mel window (application/octet-stream) → sealed encoder output or Cross-KV
POST /v1/session/close  {request_id, tag under the session key} → the session's slot is freed

Nothing is kept for a hello until its tag proves the secret; sessions are capped and expire when idle
(``sessions.py``). The worker opens a request only under the key of the session its label names, only
for a sequence number above the last one it served, and checks that the window it opened is what the
label says (digest, shape, dtype, weights). Every body is bounded in size and time (``request_body``);
every refusal is JSON ``{"error": ...}`` with a 4xx (or 503 when full) status, never a traceback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from whisperkv.boundary.associated_data import MAX_LABEL_BYTES, PartLabel, parse_label
from whisperkv.boundary.costs import stopwatch
from whisperkv.boundary.handshake import (
    MAX_HELLO_SKEW_S,
    HelloRefused,
    authenticate_hello,
    close_tag_valid,
    parse_hello,
    worker_answer,
)
from whisperkv.boundary.keys import DIRECTION_REQUEST, DIRECTION_RESPONSE, Measurement, check_secret, measure
from whisperkv.boundary.protocol import cross_kv_payload, dtype_name, request_label, response_labels
from whisperkv.boundary.request_body import BODY_DEADLINE_S, BodyRefused, ClientGone, load_json, read_body
from whisperkv.boundary.sealing import TAG_BYTES, open_part, read_parts, seal, tensor_bytes, tensor_from_bytes
from whisperkv.boundary.sessions import Session, SessionsFull, SessionTable
from whisperkv.cache.digest import tensor_digest
from whisperkv.errors import SealedCacheError

if TYPE_CHECKING:
    import socket

    from whisperkv.model.whisper import Whisper

MAX_HELLO_BYTES = 4096  # a hello is about 400 bytes
MAX_CLOSE_BYTES = 1024
RETRY_AFTER_S = 5


def max_request_bytes(model: Whisper) -> int:
    """The largest request a window can need: one float32 log-Mel part, its label and tag, the layout."""
    dims = model.dims
    return 7 + 8 + MAX_LABEL_BYTES + dims.n_mels * 2 * dims.n_audio_ctx * 4 + TAG_BYTES


@dataclass
class WorkerState:
    """Everything the app holds: the model, the secret, its measurement and the open sessions."""

    model: Whisper
    secret: bytes
    measurement: Measurement
    max_sessions: int = 256
    session_idle_s: float = 600.0
    sessions: SessionTable = field(init=False)

    def __post_init__(self) -> None:
        check_secret(self.secret)
        self.sessions = SessionTable(self.max_sessions, self.session_idle_s)

    def open_session(self, request_id: str, key: bytes, fresh_until: float | None = None) -> None:
        self.sessions.open(request_id, key, fresh_until)

    def session(self, request_id: str) -> Session | None:
        return self.sessions.get(request_id)


def _refuse(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _check_asked(model: Whisper, label: PartLabel) -> None:
    """Refuse, before opening, a request label this worker's model could not have been asked for."""
    want = {
        "kind": "log_mel",
        "layer": -1,
        "shape": (1, model.dims.n_mels, 2 * model.dims.n_audio_ctx),
        "dtype": dtype_name(model.dtype),
        "weights_digest": model.weights_digest,
        "frontend": model.frontend(),
    }
    for name, value in want.items():
        if getattr(label, name) != value:
            raise SealedCacheError(
                f"request label field '{name}' is {getattr(label, name)!r}; this worker needs {value!r}", name
            )


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
            raise LookupError(
                f"no session for request id {label.request_id!r} (never opened, closed, or idle over "
                f"{state.session_idle_s:g} s)"
            )
        _check_asked(model, label)
        payload = open_part(session.key, DIRECTION_REQUEST, 0, label, parts[0][1])
        session.sequence.admit(label.seq)
        state.sessions.touch(session)
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


def open_session(state: WorkerState, body: bytes) -> dict:
    """The handshake: parse the hello, check its tag and age, and only then derive and keep a key."""
    hello, tag = parse_hello(load_json(body))
    authenticate_hello(state.secret, hello, tag, state.sessions.wall())
    key, answer = worker_answer(state.secret, hello, state.measurement)
    state.open_session(hello.request_id, key, fresh_until=hello.issued_at + MAX_HELLO_SKEW_S)
    return answer


def close_session(state: WorkerState, body: bytes) -> JSONResponse:
    record = load_json(body)
    if not isinstance(record, dict) or set(record) != {"request_id", "tag"}:
        raise ValueError("a close request is {request_id, tag}")
    request_id, tag = record["request_id"], record["tag"]
    session = state.session(request_id) if isinstance(request_id, str) else None
    if session is None:
        return _refuse(404, "no such session")
    try:
        tag_bytes = bytes.fromhex(tag) if isinstance(tag, str) else b""
    except ValueError:
        tag_bytes = b""
    if not close_tag_valid(session.key, request_id, tag_bytes):
        return _refuse(403, "the close request's tag is wrong")
    state.sessions.close(request_id)
    return JSONResponse({"closed": request_id})


def create_app(
    model: Whisper,
    secret: bytes,
    carry: str = "features",
    max_sessions: int = 256,
    session_idle_s: float = 600.0,
    body_deadline_s: float = BODY_DEADLINE_S,
) -> FastAPI:
    """The worker app for ``model``; ``carry`` says what it sends back (features or cross_kv)."""
    state = WorkerState(model, secret, measure(model, carry), max_sessions, session_idle_s)
    request_limit = max_request_bytes(model)
    app = FastAPI(title="whisperkv encoder worker", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.worker = state

    @app.post("/v1/session")
    async def session(request: Request) -> Response:
        try:
            return JSONResponse(
                open_session(state, await read_body(request, MAX_HELLO_BYTES, body_deadline_s))
            )
        except HelloRefused as err:
            return _refuse(403, f"bad handshake: {err}")
        except SessionsFull as err:
            return _refuse(503, str(err), {"retry-after": str(RETRY_AFTER_S)})
        except ValueError as err:
            return _refuse(400, f"bad handshake: {err}")
        except BodyRefused as err:
            return _refuse(err.status, err.message)
        except ClientGone:
            return _refuse(400, "client disconnected")

    @app.post("/v1/session/close")
    async def close(request: Request) -> Response:
        try:
            return close_session(state, await read_body(request, MAX_CLOSE_BYTES, body_deadline_s))
        except ValueError as err:
            return _refuse(400, str(err))
        except BodyRefused as err:
            return _refuse(err.status, err.message)
        except ClientGone:
            return _refuse(400, "client disconnected")

    @app.post("/v1/encode")
    async def encode(request: Request) -> Response:
        try:
            body = await read_body(request, request_limit, body_deadline_s)
            blob, costs = await run_in_threadpool(encode_window, state, body)  # encoding blocks
        except BodyRefused as err:
            return _refuse(err.status, err.message)
        except ClientGone:
            return _refuse(400, "client disconnected")
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


def run_worker(
    model: Whisper,
    secret: bytes,
    carry: str,
    host: str = "127.0.0.1",
    port: int = 8001,
    sock: socket.socket | None = None,
) -> None:
    """Serve the worker with uvicorn until interrupted; on ``sock`` when given (a socket bound before the
    model loaded, ``net_bind``), else on ``host:port``."""
    import uvicorn

    app = create_app(model, secret, carry)
    if sock is None:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    else:
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


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
