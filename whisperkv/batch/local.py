"""The local engine: N worker processes on this machine, each loading the model once.

Workers pull files from one queue and send back one record per file. A worker that dies (killed, out
of memory) has its file retried once on a fresh worker; a second death records an error for that file
and the job goes on. With one worker the files run in this process (no second copy of the model).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
from collections.abc import Callable, Iterable

from whisperkv.batch.inputs import BatchItem
from whisperkv.batch.parent_watch import die_with_parent, exit_if_orphaned
from whisperkv.batch.work import JobSpec, transcribe_item

Record = dict
#: how often the parent checks that its workers are alive while waiting for records (seconds)
POLL_SECONDS = 0.5
#: attempts per file when its worker dies under it
MAX_ATTEMPTS = 2


def _worker_main(index: int, spec: JobSpec, tasks: mp.Queue, results: mp.Queue, parent: int) -> None:
    """A worker: load the model, then transcribe the files the parent hands it until it sends None.

    It dies with its parent (``parent_watch``): killed by the kernel on Linux, and everywhere it checks
    while it waits for a file and before it writes one's outputs."""
    die_with_parent(parent)
    model = spec.load_model()
    results.put((index, None))  # ready
    while True:
        try:
            task = tasks.get(timeout=POLL_SECONDS)
        except queue.Empty:
            exit_if_orphaned(parent)
            continue
        if task is None:
            return
        item, stem = task
        exit_if_orphaned(parent)
        record = transcribe_item(model, spec, item, stem, before_write=lambda: exit_if_orphaned(parent))
        results.put((index, record))


def run_local(
    spec: JobSpec,
    work: Iterable[tuple[BatchItem, str]],
    workers: int,
    on_record: Callable[[Record], None],
) -> None:
    """Transcribe every (item, output stem) with ``workers`` processes; ``on_record`` gets each record."""
    work = list(work)
    if not work:
        return
    if workers <= 1:
        model = spec.load_model()
        for item, stem in work:
            on_record(transcribe_item(model, spec, item, stem))
        return
    _Pool(spec, min(workers, len(work)), on_record).run(work)


class _Pool:
    """Worker processes with one task queue each, so the parent always knows which file each one holds."""

    def __init__(self, spec: JobSpec, workers: int, on_record: Callable[[Record], None]) -> None:
        self.spec = spec
        self.on_record = on_record
        self.ctx = mp.get_context("spawn")  # a fresh interpreter: no torch thread pools inherited
        self.results: mp.Queue = self.ctx.Queue()
        self.procs: list = [None] * workers
        self.queues: list = [None] * workers
        self.holding: list[tuple[BatchItem, str] | None] = [None] * workers
        self.restarts_left = 2 * workers  # a worker that cannot even start must not restart forever
        for i in range(workers):
            self._start(i)

    def _start(self, i: int) -> None:
        self.queues[i] = self.ctx.Queue()
        self.procs[i] = self.ctx.Process(
            target=_worker_main,
            args=(i, self.spec, self.queues[i], self.results, os.getpid()),
            daemon=True,
        )
        self.procs[i].start()
        self.holding[i] = None

    def run(self, work: list[tuple[BatchItem, str]]) -> None:
        pending = list(reversed(work))
        attempts: dict[str, int] = {}
        remaining = len(work)
        try:
            while remaining:
                try:
                    i, record = self.results.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    remaining -= self._replace_dead(pending, attempts)
                    continue
                if record is not None:
                    self.holding[i] = None
                    self.on_record(record)
                    remaining -= 1
                if pending and self.holding[i] is None:  # ready, or just finished: hand it the next file
                    task = pending.pop()
                    attempts[task[0].path] = attempts.get(task[0].path, 0) + 1
                    self.holding[i] = task
                    self.queues[i].put(task)
        finally:
            self._close()

    def _replace_dead(self, pending: list, attempts: dict[str, int]) -> int:
        """Restart dead workers; retry the file each held, or record its error after MAX_ATTEMPTS."""
        finished = 0
        for i, proc in enumerate(self.procs):
            if proc.is_alive():
                continue
            task = self.holding[i]
            if task is not None:
                if attempts[task[0].path] < MAX_ATTEMPTS:
                    pending.append(task)
                else:
                    self.on_record(_died_record(task[0], proc.exitcode))
                    finished += 1
            self.holding[i] = None
            if pending and self.restarts_left > 0:
                self.restarts_left -= 1
                self._start(i)
        if pending and not any(p.is_alive() for p in self.procs):  # no worker left to do them
            while pending:
                self.on_record(_died_record(pending.pop()[0], None))
                finished += 1
        return finished

    def _close(self) -> None:
        for i, proc in enumerate(self.procs):
            if proc.is_alive():
                self.queues[i].put(None)
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


def _died_record(item: BatchItem, exitcode: int | None) -> Record:
    why = f"exit code {exitcode}" if exitcode is not None else "no worker could be restarted"
    return {"path": item.path, "error": f"{item.path}: the worker died on this file ({why})"}
