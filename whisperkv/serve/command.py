"""``whisperkv serve``: load the model, start one scheduler, serve the OpenAI audio API with uvicorn.

SIGTERM (or Ctrl-C) drains: new requests get 503 at once, every job already submitted finishes and is
answered, then uvicorn closes its connections and the process exits 0. A second signal exits at once
(status 128 + the signal's number: 143 for SIGTERM, 130 for Ctrl-C), abandoning what is in flight.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Any

API_KEY_ENV = "WHISPERKV_API_KEY"
#: seconds uvicorn gives open connections after the drain before it cancels them
SHUTDOWN_GRACE_S = 10
#: WebSocket messages uvicorn buffers per connection before it stops reading (each up to ws_max_size): the
#: session reads ahead itself (realtime.INBOX_EVENTS)
WS_MAX_QUEUE = 1


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):  # nan, inf: refused by every option
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def _audio_seconds(text: str) -> float:
    value = _number(text)
    if not 0 < value <= 1e7:  # also refuses nan and inf (the limit is counted in samples)
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0 and at most 1e7, got {text}")
    return value


def _seconds_or_off(text: str) -> float:
    value = _number(text)
    if not 0 <= value < 1e6:  # also refuses nan and inf (a wait that long overflows the lock's timeout)
        raise argparse.ArgumentTypeError(f"must be 0 (never) or a number of seconds under 1e6, got {text}")
    return value


def add_serve_parser(sub: Any) -> None:
    from whisperkv.cli_types import positive_int
    from whisperkv.net_bind import port_number
    from whisperkv.serve.limits import add_limit_flags

    p = sub.add_parser("serve", help="serve the OpenAI audio API (transcriptions, translations) over HTTP")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8000, help="port (default: 8000; 0: any free one)")
    p.add_argument("--model", default="tiny.en", help="model name (tiny.en, base) or path (default: tiny.en)")
    p.add_argument(
        "--compute_type",
        default="default",
        choices=["default", "float32", "int8", "bfloat16"],
        help="int8 or bfloat16: faster, approximations",
    )
    p.add_argument("--max_batch", type=positive_int, default=16, help="rows per decoder step (default: 16)")
    p.add_argument(
        "--max_queue", type=positive_int, default=64, help="jobs queued or running before 429 (default: 64)"
    )
    p.add_argument(
        "--max_upload_mb", type=_positive_float, default=100.0, help="largest upload (default: 100)"
    )
    p.add_argument(
        "--max_audio_s",
        type=_audio_seconds,
        default=10800.0,
        help="longest audio an upload may hold, in seconds; longer is a 413 (default: 10800, 3 hours)",
    )
    p.add_argument(
        "--api_key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}, if set)",
    )
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: torch's default)")
    p.add_argument(
        "--body_timeout",
        type=_positive_float,
        default=30.0,
        help="seconds a client has to send a whole request body; then 408 (default: 30)",
    )
    p.add_argument(
        "--realtime_sessions",
        type=positive_int,
        default=16,
        help="Realtime WebSocket sessions open at once; one more is refused with 503 (default: 16)",
    )
    p.add_argument(
        "--realtime_buffer_s",
        type=_positive_float,
        default=60.0,
        help="seconds of uncommitted audio a Realtime session may hold (default: 60); one append event "
        "carries at most 15 s",
    )
    p.add_argument(
        "--idle_trim",
        type=_seconds_or_off,
        default=2.0,
        help="give the heap's free memory back after this many idle seconds (0: never; default: 2)",
    )
    add_limit_flags(p)  # --max_beam_size, --max_best_of, --max_temperatures, --max_prompt_tokens, ...


def _server_class():
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn, but the first signal drains the scheduler before uvicorn's own shutdown begins.

        uvicorn alone would close the listening socket at once (new clients: connection refused) and then
        re-raise the signal after shutdown (exit status -15); here new requests are answered 503 while
        in-flight jobs finish, and the process exits 0.
        """

        def __init__(self, config: uvicorn.Config, lifecycle: Any) -> None:
            super().__init__(config)
            self.lifecycle = lifecycle
            self._draining = False

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self._draining:  # a second signal: stop now, status 128 + signal, like a shell's
                # (uvicorn's own forced exit skips the app's shutdown, and the app's lifespan task, then
                # cancelled at teardown, was logged as a traceback)
                print(f"whisperkv serve: signal {sig} again: exiting now", file=sys.stderr, flush=True)
                sys.stdout.flush()
                os._exit(128 + sig)
            self._draining = True
            self.lifecycle.begin_shutdown()
            threading.Thread(target=self._drain_then_exit, name="drain", daemon=True).start()

        def _drain_then_exit(self) -> None:
            try:
                self.lifecycle.drain()
            finally:
                self.should_exit = True

    return DrainingServer


def cmd_serve(args: argparse.Namespace) -> int:
    """Bind the port first (a bad or busy one is one error line, exit 2, before the model loads), then
    load the model and serve on that socket."""
    from whisperkv.net_bind import bind_listening_socket

    sock = bind_listening_socket(args.host, args.port)
    try:
        return _serve_on(sock, args)
    finally:
        sock.close()


def _serve_on(sock: Any, args: argparse.Namespace) -> int:
    import torch
    import uvicorn

    from whisperkv.engine import Scheduler
    from whisperkv.load import load_model
    from whisperkv.net_bind import listening_url
    from whisperkv.serve.app import create_app
    from whisperkv.serve.limits import limits_from_args
    from whisperkv.serve.realtime import MESSAGE_OVERHEAD_CHARS, max_message_chars
    from whisperkv.serve.settings import ServeSettings

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(args.model, compute_type=args.compute_type)
    scheduler = Scheduler(
        model, max_batch=args.max_batch, max_queue=args.max_queue, idle_trim_s=args.idle_trim or None
    )
    settings = ServeSettings(
        model_name=args.model,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None,
        max_upload_bytes=int(args.max_upload_mb * 1024 * 1024),
        max_audio_s=args.max_audio_s,
        body_timeout_s=args.body_timeout,
        realtime_max_sessions=args.realtime_sessions,
        realtime_buffer_s=args.realtime_buffer_s,
        limits=limits_from_args(args),
    )
    app = create_app(model, scheduler, settings)
    config = uvicorn.Config(
        app,
        log_level="info",
        # after the drain, connections still open get this long (a body still being read is answered
        # 503 at once, see slow_clients)
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        # a WebSocket message a little over the session's own cap is an error event and the session goes
        # on; one past this closes the socket (1009) before it is read whole
        ws_max_size=max_message_chars(settings.realtime_buffer_s) + MESSAGE_OVERHEAD_CHARS,
        ws_max_queue=WS_MAX_QUEUE,
    )
    print(f"whisperkv serve: listening on {listening_url(sock)}", file=sys.stderr, flush=True)
    _server_class()(config, app.state.lifecycle).run(sockets=[sock])
    return 0
