"""The worker's open sessions: capped, expired when idle, and never opened twice for one hello.

A session is opened only for a hello the worker has authenticated (``handshake.authenticate_hello``),
so only a holder of the secret can take a slot. When every slot is taken by a session that is still in
use, a new hello is refused (``SessionsFull``, HTTP 503) rather than evicting a live session: a
transcription under way never loses its key to someone else's hellos. A session idle for ``idle_s``
seconds, or closed by its decoder, frees its slot. The request ids of recent hellos are remembered until
their hellos are stale, so a recorded hello sent again opens nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from whisperkv.boundary.handshake import HelloRefused
from whisperkv.boundary.replay import WorkerSequence


class SessionsFull(Exception):
    """Every session slot is held by a session still in use; the decoder should retry later (HTTP 503)."""


@dataclass
class Session:
    key: bytes
    last_used: float = 0.0
    sequence: WorkerSequence = field(default_factory=WorkerSequence)


class SessionTable:
    """At most ``max_sessions`` sessions by request id; ``clock`` is monotonic seconds, ``wall`` Unix time."""

    def __init__(
        self,
        max_sessions: int = 256,
        idle_s: float = 600.0,
        max_remembered: int = 65536,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self.max_remembered = max_remembered
        self.clock, self.wall = clock, wall
        self._sessions: dict[str, Session] = {}
        self._seen: dict[str, float] = {}  # request id -> Unix time until which its hello is fresh
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._expire(self.clock())
            return len(self._sessions)

    def _expire(self, now: float) -> None:
        for request_id in [r for r, s in self._sessions.items() if now - s.last_used > self.idle_s]:
            del self._sessions[request_id]

    def open(self, request_id: str, key: bytes, fresh_until: float | None = None) -> None:
        """Keep ``key`` for ``request_id``; ``fresh_until``: when the hello that asked for it goes stale."""
        with self._lock:
            now, wall = self.clock(), self.wall()
            for seen in [r for r, until in self._seen.items() if until < wall]:
                del self._seen[seen]
            if request_id in self._seen or request_id in self._sessions:
                raise HelloRefused(f"request id {request_id} already had a session: a replayed hello")
            self._expire(now)
            if len(self._sessions) >= self.max_sessions or len(self._seen) >= self.max_remembered:
                raise SessionsFull(
                    f"the worker holds its maximum of {self.max_sessions} sessions in use; retry later"
                )
            self._sessions[request_id] = Session(key, now)
            self._seen[request_id] = wall if fresh_until is None else fresh_until

    def get(self, request_id: str) -> Session | None:
        """The live session of ``request_id`` (None if unknown, closed or expired); does not renew it."""
        with self._lock:
            self._expire(self.clock())
            return self._sessions.get(request_id)

    def touch(self, session: Session) -> None:
        """``session`` was just used for an authenticated request: its idle time starts again."""
        with self._lock:
            session.last_used = self.clock()

    def close(self, request_id: str) -> None:
        with self._lock:
            self._sessions.pop(request_id, None)
