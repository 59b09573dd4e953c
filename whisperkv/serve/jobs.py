"""Waiting for a scheduler job from the event loop, and cancelling it when the client goes away.

``JobHandle.result()`` and ``segments()`` block, so each waits in its own small thread (not the shared
worker pool, which 64 queued requests would exhaust) and hands its answer to the loop. Meanwhile the
request's ``receive`` channel is watched: ``http.disconnect`` before the answer cancels the job, so a
client that hangs up frees its rows at the scheduler's next step.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.types import Receive


class ClientDisconnected(Exception):
    """The client closed the connection before its job finished (the job was cancelled)."""


def _deliver(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # the loop closed (server gone): nobody is waiting any more
        pass


def _in_thread(name: str, fn: Callable[[], Any]) -> asyncio.Future:
    """Run a blocking call on its own daemon thread; its result or error lands in the returned future."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def work() -> None:
        try:
            value = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the awaiting request as it is
            _deliver(loop, settle, None, err)
        else:
            _deliver(loop, settle, value, None)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future


def _abandon(future: asyncio.Future) -> None:
    """Nobody will read this future (its client left): read its error when it lands, or asyncio logs
    "Future exception was never retrieved" with the cancelled job's traceback."""
    future.add_done_callback(lambda f: None if f.cancelled() else f.exception())


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def wait_for_result(handle: Any, receive: Receive | None) -> dict:
    """The job's result; cancels the job and raises ClientDisconnected if the client hangs up first
    (``receive`` None: the caller watches the client itself)."""
    result = _in_thread(f"wait-{handle.request_id}", handle.result)
    watcher = asyncio.ensure_future(_disconnected(receive) if receive else asyncio.Event().wait())
    try:
        await asyncio.wait({result, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if result.done():
            return result.result()
        handle.cancel()
        _abandon(result)
        raise ClientDisconnected(handle.request_id)
    except asyncio.CancelledError:
        handle.cancel()
        _abandon(result)
        raise
    finally:
        watcher.cancel()


async def iterate_segments(handle: Any) -> AsyncIterator[dict]:
    """Each finished segment of the job as the scheduler produces it (for Server-Sent Events)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    def pump() -> None:
        try:
            for segment in handle.segments():
                _deliver(loop, queue.put_nowait, segment)
        except Exception:  # noqa: BLE001 - the job's error is raised again by handle.result()
            pass
        finally:
            _deliver(loop, queue.put_nowait, end)

    threading.Thread(target=pump, name=f"segments-{handle.request_id}", daemon=True).start()
    while (item := await queue.get()) is not end:
        yield item
