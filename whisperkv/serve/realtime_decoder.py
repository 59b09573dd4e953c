"""A Realtime session's updates, decoded as jobs of the server's scheduler with the stream's state kept.

Each update is an ``UpdateJob`` (``whisperkv/stream/update_job.py``): its decoder steps are batched with
every other request's, and its reuse is the stream's own — the same store, ledger and provenance checks
as ``whisperkv stream`` in one process, so the server takes the same exact reuse (the re-decode of an
utterance closed with no new speech, temperature retries) and reports the same counts. The session's
id is the request every provenance record names: no session is handed another's window.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from whisperkv.errors import JobCancelledError
from whisperkv.stream.hypothesis import Hypothesis
from whisperkv.stream.update_job import UpdateJob
from whisperkv.stream.update_state import StreamState
from whisperkv.transcribe import DEFAULT_TEMPERATURES


class SchedulerDecoder:
    """A stream's ``UpdateDecoder`` whose updates run on the server's scheduler."""

    def __init__(self, scheduler: Any, model: Any, language: str | None, stream_id: str) -> None:
        self.scheduler = scheduler
        self.state = StreamState(model, language, DEFAULT_TEMPERATURES, request_id=stream_id)
        self.current: Any = None  # the job in flight
        self.cancelled = False

    @property
    def updates(self) -> int:
        return self.state.updates

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str) -> Hypothesis:
        if self.cancelled:
            raise JobCancelledError(f"stream {self.state.request_id} was cancelled")
        job = UpdateJob(self.state, audio, start_sample, prompt)  # the log-Mel here, off the model's thread
        self.current = self.scheduler.submit_job(job)
        try:
            return self.current.result()["hypothesis"]
        finally:
            self.current = None

    def release(self) -> None:
        """The utterance closed: the window it held serves no later update."""
        self.state.release()

    def cancel(self) -> None:
        """The client left: drop the job in flight and decode nothing more."""
        self.cancelled = True
        current = self.current
        if current is not None:
            current.cancel()

    def reuse_summary(self) -> dict:
        return self.state.summary()
