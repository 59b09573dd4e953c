"""Listening sockets for the commands that serve (``serve``, ``encoder-worker``), bound before any work.

A bad or busy port is found by binding the socket first, before the model loads, and said in one line
(``whisperkv: error: ...``, exit 2, through the CLI's handling of ``ValueError``). uvicorn is then handed
the bound socket (``Server.run(sockets=[...])``), so nothing can take the port in between and uvicorn never
prints its own tracebacks for it.
"""

from __future__ import annotations

import argparse
import errno
import socket

#: the backlog uvicorn itself listens with
BACKLOG = 2048


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 (any free one) to 65535; anything else is a one-line usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 0 to 65535, got {value}")
    return value


class ListenError(ValueError):
    """The address could not be listened on (busy, not this machine's, not permitted, not resolvable)."""


def _reason(err: OSError) -> str:
    if err.errno == errno.EADDRINUSE:
        return "the address is already in use (another server on this port?)"
    if err.errno == errno.EADDRNOTAVAIL:
        return "the address is not one of this machine's"
    if err.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    if isinstance(err, socket.gaierror):
        return f"the host name does not resolve ({err.strerror})"
    return err.strerror or str(err)


def bind_listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` and listening, as uvicorn would bind it (IPv6 when the host has a
    ':'; SO_REUSEADDR); raises :class:`ListenError` naming the address and why."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.set_inheritable(True)
    except OSError as err:
        sock.close()
        where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
        raise ListenError(f"cannot listen on {where}: {_reason(err)}") from None
    except OverflowError:  # a port outside 0-65535 reached here without port_number
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: not a port number (0 to 65535)") from None
    return sock


def listening_url(sock: socket.socket, scheme: str = "http") -> str:
    """Where ``sock`` listens, as a URL (the real port when 0 was asked for)."""
    host, port = sock.getsockname()[:2]
    return f"{scheme}://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{scheme}://{host}:{port}"
