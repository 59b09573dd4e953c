"""What a caller holds for a submitted job: its result, its segments as they finish, and cancel.

The scheduler's thread writes (segments, the result or the error); any other thread reads. A handle
never touches the model or the job's caches.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from whisperkv.errors import JobCancelledError

_END = object()


class JobHandle:
    """One submitted transcription: ``result()``, ``segments()``, ``cancel()``, ``done``."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._done = threading.Event()
        self._result: dict | None = None
        self._error: BaseException | None = None
        self._segments: queue.Queue = queue.Queue()
        self.cancel_requested = False

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> dict:
        """The dict ``transcribe()`` returns; re-raises the job's error (``JobCancelledError`` if cancelled)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.request_id} not done after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def segments(self) -> Iterator[dict]:
        """Each finished segment as soon as its window is done; ends when the job ends."""
        while True:
            item = self._segments.get()
            if item is _END:
                self._segments.put(_END)  # a second iterator ends too
                return
            yield item

    def cancel(self) -> None:
        """Ask the scheduler to drop the job: its rows leave the batch at the next step."""
        self.cancel_requested = True

    # ------------------------------------------------------------------ written by the scheduler only

    def _push_segments(self, segments: list[dict]) -> None:
        for segment in segments:
            self._segments.put(segment)

    def _finish(self, result: dict | None = None, error: BaseException | None = None) -> None:
        if self.done:
            return
        self._result, self._error = result, error
        self._segments.put(_END)
        self._done.set()

    def _cancelled(self) -> None:
        self._finish(error=JobCancelledError(f"job {self.request_id} was cancelled"))
