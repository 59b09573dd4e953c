"""The boundary's command-line parts: ``whisperkv encoder-worker`` and the options that send windows to one.

``--encoder_url``/``--secret_file``/``--carry`` are shared by ``transcribe`` and ``verify``: the decoder side
keeps the front end and decoding local and asks the worker for each window, sealed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def add_remote_encoder_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "--encoder_url",
        default=None,
        help="encode windows on this worker, sealed (e.g. http://127.0.0.1:8001)",
    )
    p.add_argument(
        "--secret_file",
        default=None,
        help="file holding the secret shared with the worker: 32 random bytes, mode 600 "
        "(head -c 32 /dev/urandom > boundary.key; chmod 600 boundary.key)",
    )
    p.add_argument(
        "--carry", default="features", choices=["features", "cross_kv"], help="what the worker sends back"
    )
    return p


def remote_encoder(args: argparse.Namespace):
    """The ``RemoteEncoder`` the options ask for, or None for the local encoder."""
    if not getattr(args, "encoder_url", None):
        return None
    if not args.secret_file:
        raise ValueError("--encoder_url needs --secret_file")
    from whisperkv.boundary.client import RemoteEncoder
    from whisperkv.boundary.keys import read_secret

    return RemoteEncoder(args.encoder_url, read_secret(args.secret_file), carry=args.carry)


def add_parser(sub) -> None:
    from whisperkv.cli_options import add_model_args, add_parser
    from whisperkv.net_bind import port_number

    p = add_parser(sub, "encoder-worker", "serve the encoder over HTTP; every answer is sealed")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=port_number, default=8001, help="port to listen on (0: any free one)")
    add_model_args(p)
    p.add_argument(
        "--compute_type",
        default="default",
        choices=["default", "float32", "int8", "bfloat16"],
        help="int8 or bfloat16: faster, approximations",
    )
    p.add_argument(
        "--secret_file",
        required=True,
        help="file holding the secret shared with decoders: 32 random bytes (or 64 hex digits), mode 600",
    )
    p.add_argument("--carry", default="features", choices=["features", "cross_kv"], help="what to send back")


def run(args: argparse.Namespace, load: Callable[[argparse.Namespace], Any]) -> int:
    """``whisperkv encoder-worker``. ``load`` is the command line's model loader (``--model``, ``--device``,
    ``--threads``, ``--compute_type``), given by ``cli.main`` so that this module need not import it."""
    from whisperkv.boundary.keys import read_secret
    from whisperkv.boundary.worker import run_worker
    from whisperkv.net_bind import bind_listening_socket, listening_url

    secret = read_secret(args.secret_file)
    # a bad or busy port: one error line before the model loads; uvicorn then serves on this socket
    with bind_listening_socket(args.host, args.port) as sock:
        model = load(args)
        print(f"whisperkv encoder-worker: listening on {listening_url(sock)}", file=sys.stderr, flush=True)
        run_worker(model, secret, args.carry, sock=sock)
    return 0
