"""Waiting for a job from the event loop (``serve/jobs.py``): a client that leaves cancels its job, and
the job's later error is read, not logged as an asyncio "exception was never retrieved"."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading

import pytest

from whisperkv.errors import JobCancelledError
from whisperkv.serve.jobs import ClientDisconnected, wait_for_result


class _Handle:
    """A job that runs until it is cancelled, then fails as a cancelled scheduler job does."""

    request_id = "req-test"

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.raised = threading.Event()

    def result(self) -> dict:
        self.cancelled.wait(10)
        self.raised.set()
        raise JobCancelledError(f"job {self.request_id} was cancelled")

    def cancel(self) -> None:
        self.cancelled.set()


def test_a_client_that_leaves_cancels_its_job_and_its_error_is_not_logged(caplog):
    handle = _Handle()

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def scenario() -> None:
        with pytest.raises(ClientDisconnected):
            await wait_for_result(handle, receive)
        assert handle.cancelled.is_set()
        assert await asyncio.to_thread(handle.raised.wait, 10)
        await asyncio.sleep(0.1)  # the thread's answer reaches the loop

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(scenario())
        gc.collect()  # an unread future's error is logged when it is collected
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()], caplog.text
