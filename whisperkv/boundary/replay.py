"""Replay and reorder protection: every window has a sequence number, and a blob opens once.

Within one session (one request, one key) the decoder numbers its windows 0, 1, 2, ... and accepts a
response only for the number it is waiting for, once. The worker accepts only increasing numbers, so a
recorded request replayed to it is refused too (and it never seals twice under one nonce).
"""

from __future__ import annotations

import threading

from whisperkv.errors import SealedCacheError


class DecoderSequence:
    """The decoder's side: numbers to ask with, and the numbers already opened."""

    def __init__(self) -> None:
        self._next = 0
        self._opened: set[int] = set()
        self._lock = threading.Lock()

    def issue(self) -> int:
        with self._lock:
            seq, self._next = self._next, self._next + 1
            return seq

    def accept(self, seq: int) -> None:
        """Record that the blob for ``seq`` opened; a second opening (or an unasked number) is refused."""
        with self._lock:
            if seq in self._opened:
                raise SealedCacheError(
                    f"replayed blob: window {seq} of this request was already opened", "seq"
                )
            if not 0 <= seq < self._next:
                raise SealedCacheError(f"blob for window {seq}, which this request never asked for", "seq")
            self._opened.add(seq)


class WorkerSequence:
    """The worker's side: each session's sequence numbers must increase."""

    def __init__(self) -> None:
        self._last = -1
        self._lock = threading.Lock()

    def admit(self, seq: int) -> None:
        with self._lock:
            if seq <= self._last:
                raise SealedCacheError(
                    f"replayed or reordered request: window {seq} after window {self._last}", "seq"
                )
            self._last = seq
