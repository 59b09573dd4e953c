"""A benchmark server's process: a free port on 127.0.0.1, its start (until /health answers), stop, RSS.

Used by ``benchmarks/serve.py`` for whisperkv's servers and faster-whisper's alike, so both are started,
waited for and measured the same way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int, field: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


@contextmanager
def server(command: list[str], port: int, repo: Path) -> Iterator[subprocess.Popen]:
    """Start a server process (``repo``'s code), wait for /health, stop it with SIGTERM at the end."""
    import httpx

    env = {**os.environ, "PYTHONPATH": str(repo)}
    env.pop("WHISPERKV_API_KEY", None)
    # cwd: ``python -m`` puts the working directory first on sys.path, ahead of PYTHONPATH
    process = subprocess.Popen(
        command, env=env, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"server exited: {process.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.2)
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(300)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
