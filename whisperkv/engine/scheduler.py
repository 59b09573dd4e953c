"""One scheduler owns the model; every active job's current window advances one decoder step per tick.

A tick, top to bottom:
1. admit queued jobs while the rows in flight stay within ``max_batch``; drop cancelled jobs;
2. give every job without a window its next one: encode it (through the job's ``CacheStore``, which
   names the request in every provenance), then prefill its prompt alone — it joins the next step;
3. ONE decoder step for every active row of every job (``TextDecoder.forward_rows``), in chunks of at
   most ``max_batch`` rows: each window's rows keep their own positions, Self-KV and Cross-KV; then
   the vocabulary, one product for every row;
4. windows whose rows finished leave at once: their caches are freed and the result goes back to its
   job, which asks for a temperature retry, moves on to its next window, or is done.

The job is the long-form loop (``job.py``); the scheduler only decides what runs together. A job's
result does not depend on what else is in the batch (see ``cpu/row_gemm.py``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from whisperkv.decoding.window import WindowDecode
from whisperkv.engine.handle import JobHandle
from whisperkv.engine.job import Job, WindowTask
from whisperkv.engine.options import TranscribeOptions
from whisperkv.errors import QueueFullError, ShuttingDownError
from whisperkv.heap import give_back_free_memory

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper


@dataclass(eq=False)
class _Active:
    """A job the scheduler is running, with the window it is decoding now (if any)."""

    handle: JobHandle
    job: Job
    task: WindowTask | None = None
    rows: WindowDecode | None = None
    segments_sent: int = 0

    @property
    def n_rows(self) -> int:
        return self.rows.rows if self.rows is not None else self.job.expected_rows


class Scheduler:
    """One thread owns the model; every active job's current window advances one decoder step per tick."""

    def __init__(
        self, model: Whisper, *, max_batch: int = 16, max_queue: int = 64, idle_trim_s: float | None = 2.0
    ) -> None:
        if max_batch < 1 or max_queue < 1:
            raise ValueError(f"max_batch and max_queue must be at least 1, got {max_batch} and {max_queue}")
        if idle_trim_s is not None and not 0 < idle_trim_s < 1e6:
            raise ValueError(f"idle_trim_s must be None or above 0 and under 1e6 seconds, got {idle_trim_s}")
        self.model = model
        self.max_batch = max_batch
        self.max_queue = max_queue
        #: the background loop (``start``) gives the heap's free memory back after this many idle seconds
        #: (``heap.give_back_free_memory``), once per idle spell; None: never
        self.idle_trim_s = idle_trim_s
        self._lock = threading.Lock()  # the queue, the active list, the flags, the stats
        self._wake = threading.Condition(self._lock)
        self._model_lock = threading.Lock()  # one driver of the model at a time
        self._queue: deque[_Active] = deque()
        self._active: list[_Active] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stats = {
            "last_batch_rows": 0,
            "steps_total": 0,
            "tokens_total": 0,
            "self_kv_bytes": 0,
            "cross_kv_bytes": 0,
            "heap_trims": 0,  # idle spells after which the heap's free memory went back to the kernel
            "windows_encoded": 0,  # windows the encoder ran for (a retry's or a hit's reuse is not one)
            "encoder_seconds": 0.0,  # wall time of those encodes, Cross-KV projection included
        }

    # ---------------------------------------------------------------------------------- public API

    def start(self) -> None:
        """Run the loop in a background thread (a server); idempotent."""
        with self._lock:
            if self._stopping:
                raise ShuttingDownError("the scheduler is stopping")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="whisperkv-scheduler", daemon=True)
                self._thread.start()

    def submit(self, audio: Any, options: dict | None = None, *, request_id: str | None = None) -> JobHandle:
        """Queue a transcription of ``audio`` with ``transcribe()``'s keyword options."""
        self._check_capacity()
        options = {k: v for k, v in (options or {}).items() if k != "verbose"}
        request_id = request_id or uuid.uuid4().hex
        job = Job(self.model, audio, TranscribeOptions.from_dict(options), request_id)
        return self.submit_job(job)

    def submit_job(self, job: Job) -> JobHandle:
        """Queue a job built by the caller (``transcribe()`` builds one with ``verbose``)."""
        handle = JobHandle(job.request_id)
        with self._lock:
            self._check_capacity_locked()
            self._queue.append(_Active(handle, job))
            self._wake.notify_all()
        return handle

    def run(self, handle: JobHandle) -> dict:
        """Drive the loop in the calling thread until ``handle``'s job is done; its result."""
        if self._thread is not None:
            return handle.result()
        while not handle.done:
            if not self.tick():
                raise RuntimeError(f"job {handle.request_id} is not known to this scheduler")
        return handle.result()

    def stop(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stop accepting jobs; with ``drain`` finish every queued and running one, else cancel them."""
        with self._lock:
            self._stopping = True
            if not drain:
                for entry in [*self._queue, *self._active]:
                    entry.handle.cancel()
            self._wake.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        else:
            while self.tick():
                pass

    def stats(self) -> dict:
        with self._lock:
            return {
                "queue_depth": len(self._queue),
                "active_jobs": len(self._active),
                "active_rows": sum(a.rows.rows for a in self._active if a.rows is not None),
                **self._stats,
            }

    def held_caches(self) -> list[dict]:
        """The request every held Self-KV and Cross-KV row names, per window in flight (for audits)."""
        with self._model_lock:
            held = []
            for entry in self._active:
                if entry.rows is None:
                    continue
                cache = entry.rows.cache
                held.append(
                    {
                        "request_id": entry.job.request_id,
                        "rows": entry.rows.rows,
                        "cross_kv": [kv.provenance.encoder.request_id for kv in cache.cross_kv],
                        "self_kv": [
                            [kv.provenance(row).request_id for row in range(entry.rows.rows)]
                            for kv in cache.self_kv
                        ],
                    }
                )
            return held

    def active_jobs(self) -> list[Job]:
        with self._lock:
            return [entry.job for entry in self._active]

    # ---------------------------------------------------------------------------------- the loop

    def tick(self) -> bool:
        """One scheduling step; False when there was nothing to do."""
        with self._model_lock:
            self._admit()
            if not self._active:
                return False
            self._drop_cancelled()
            self._start_windows()
            self._decoder_step()
            self._finish_windows()
            self._update_stats()
            return True

    def _loop(self) -> None:
        trimmed = True  # nothing to give back before the first job
        while True:
            with self._lock:
                idle, timeout = False, None if trimmed else self.idle_trim_s
                while not (self._queue or self._active or self._stopping or idle):
                    idle = not self._wake.wait(timeout)  # False: nothing came for idle_trim_s seconds
                if not idle and self._stopping and not self._queue and not self._active:
                    return
            if idle:  # outside the lock: submit() never waits for the trim
                gave_back, trimmed = give_back_free_memory(), True
                with self._lock:
                    self._stats["heap_trims"] += int(gave_back)
                continue
            trimmed = False
            self.tick()

    def _admit(self) -> None:
        """Queued jobs join while the rows in flight stay within ``max_batch`` (one job always may)."""
        with self._lock:
            rows = sum(a.n_rows for a in self._active)
            while self._queue:
                entry = self._queue[0]
                if entry.handle.cancel_requested:
                    self._queue.popleft()
                    entry.job.close()
                    entry.handle._cancelled()
                    continue
                if self._active and rows + entry.n_rows > self.max_batch:
                    break
                self._queue.popleft()
                self._active.append(entry)
                rows += entry.n_rows

    def _drop_cancelled(self) -> None:
        for entry in [a for a in self._active if a.handle.cancel_requested]:
            self._remove(entry)
            entry.handle._cancelled()

    def _start_windows(self) -> None:
        """Every job without a window gets its next one: encoded, prompt prefilled."""
        for entry in list(self._active):
            if entry.rows is not None:
                continue
            try:
                job = entry.job
                if not job.started:
                    job.start()
                if entry.task is None:
                    entry.task = job.next_window()
                    if entry.task is None:  # the audio is done
                        self._remove(entry)
                        entry.handle._finish(result=job.result())
                        continue
                if entry.task.window is None:
                    entry.task.window = self._encode(job, entry.task)
                entry.rows = job.window_rows(entry.task)
                entry.rows.prefill()
            except Exception as err:  # noqa: BLE001 - the job fails, the loop and the other jobs go on
                self._fail(entry, err)

    def _encode(self, job: Job, task: WindowTask):  # noqa: ANN202 - EncodedWindow
        """THE place a window is encoded: through the job's own store (its provenance names the job).
        The encoder's time is counted (``windows_encoded``, ``encoder_seconds``): what the server would
        take if every decoder step were free (``benchmarks/serve.py`` prints that ceiling)."""
        misses, started = job.store.misses, time.perf_counter()
        window = job.store.encode(self.model, task.mel, task.window_start, task.window_end, "same window")
        if job.store.misses > misses:
            with self._lock:
                self._stats["windows_encoded"] += 1
                self._stats["encoder_seconds"] += time.perf_counter() - started
        return window

    @torch.no_grad()
    def _decoder_step(self) -> None:
        """One decoder step for every active row, in chunks of at most ``max_batch`` rows."""
        live = [a for a in self._active if a.rows is not None and not a.rows.done]
        steps: list[tuple[_Active, list]] = []
        for entry in live:
            try:
                steps.append((entry, entry.rows.step_inputs()))
            except Exception as err:  # noqa: BLE001 - this job fails; the loop and the others go on
                self._fail(entry, err)
        steps_before = [entry.rows.steps for entry, _ in steps]
        chunk: list[tuple[_Active, list]] = []
        rows = 0
        last = 0
        for entry, groups in steps:
            n = sum(tokens.shape[0] for tokens, _ in groups)
            if chunk and rows + n > self.max_batch:
                self._step_chunk(chunk)
                last = max(last, rows)
                chunk, rows = [], 0
            chunk.append((entry, groups))
            rows += n
        if chunk:
            self._step_chunk(chunk)
            last = max(last, rows)
        with self._lock:
            self._stats["last_batch_rows"] = last
            if steps:
                self._stats["steps_total"] += 1
                # every row of a window took one token; a window that failed this step took none
                self._stats["tokens_total"] += sum(
                    (a.rows.steps - before) * a.rows.rows
                    for (a, _), before in zip(steps, steps_before, strict=True)
                    if a.rows is not None
                )

    def _step_chunk(self, chunk: list[tuple[_Active, list]]) -> None:
        """The chunk's rows through the decoder at once (one product for the vocabulary); then each
        window takes its step's tokens from its rows of the logits, in chunk order."""
        try:
            logits = self.model.decoder.forward_rows([g for _, window_groups in chunk for g in window_groups])
        except Exception as err:  # noqa: BLE001 - every window of this step fails; the loop goes on
            for entry, _ in chunk:
                self._fail(entry, err)
            return
        taken = 0
        for entry, groups in chunk:
            n = sum(tokens.shape[0] for tokens, _ in groups)
            # counted even if this window fails; a lone window takes the logits as they are (no slice)
            rows, taken = logits if len(chunk) == 1 else logits[taken : taken + n], taken + n
            try:
                entry.rows.advance(rows)
            except Exception as err:  # noqa: BLE001
                self._fail(entry, err)

    def _finish_windows(self) -> None:
        """Windows whose rows finished leave the batch; their results go back to their jobs."""
        for entry in [a for a in self._active if a.rows is not None and a.rows.done]:
            try:
                result = entry.rows.result()
                entry.rows.release()
                entry.rows = None
                entry.task = entry.job.window_done(entry.task, result)  # a retry, or None: next window
                new = entry.job.all_segments[entry.segments_sent :]
                entry.segments_sent += len(new)
                entry.handle._push_segments(new)
            except Exception as err:  # noqa: BLE001
                self._fail(entry, err)

    def _fail(self, entry: _Active, err: BaseException) -> None:
        self._remove(entry)
        entry.handle._finish(error=err)

    def _remove(self, entry: _Active) -> None:
        if entry.rows is not None:
            entry.rows.release()
            entry.rows = None
        entry.task = None
        entry.job.close()
        with self._lock:
            if entry in self._active:
                self._active.remove(entry)

    def _update_stats(self) -> None:
        self_kv = sum(a.rows.cache.self_kv_nbytes for a in self._active if a.rows is not None)
        cross_kv = sum(
            kv.nbytes
            for a in self._active
            for window in a.job.store.entries.values()
            for kv in window.cross_kv
        )
        with self._lock:
            self._stats["self_kv_bytes"] = self_kv
            self._stats["cross_kv_bytes"] = cross_kv

    def _check_capacity(self) -> None:
        with self._lock:
            self._check_capacity_locked()

    def _check_capacity_locked(self) -> None:
        if self._stopping:
            raise ShuttingDownError("the scheduler is shutting down and accepts no new jobs")
        if len(self._queue) + len(self._active) >= self.max_queue:
            raise QueueFullError(f"{self.max_queue} jobs are queued or running; try again later")
