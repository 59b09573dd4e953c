"""The Ray engine: the same per-file work on Ray actors, each loading the model once.

Each actor is a worker process (one CPU) holding one model; a pool hands files to idle actors and
yields records as they finish, so progress and ``results.jsonl`` advance file by file. Ray restarts an
actor that dies and retries the file it was working on (``max_restarts``, ``max_task_retries``): the
retried file runs the same deterministic code on the same weights, so it gives the same transcript.
With no address a local Ray is started (and stopped) for the job; ``auto`` or HOST:PORT joins a cluster,
whose nodes must see the same input paths and output folder (a shared filesystem).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from whisperkv.batch.inputs import BatchItem
from whisperkv.batch.work import JobSpec, transcribe_item

#: times Ray restarts a dead actor, and retries the file it held
MAX_RESTARTS = 3


class TranscribeActor:
    """A Ray actor: one model, many files."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.model = spec.load_model()

    def transcribe(self, item: BatchItem, stem: str) -> dict:
        return transcribe_item(self.model, self.spec, item, stem)


def run_ray(
    spec: JobSpec,
    work: Iterable[tuple[BatchItem, str]],
    workers: int,
    on_record: Callable[[dict], None],
    address: str | None = None,
) -> None:
    """Transcribe every (item, output stem) on ``workers`` Ray actors; ``on_record`` gets each record."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("--engine ray needs Ray: pip install 'whisperkv[ray]'") from None
    work = list(work)
    if not work:
        return
    started_here = not ray.is_initialized()
    if started_here:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=max(workers, 1), include_dashboard=False, log_to_driver=False)
    try:
        actor_class = ray.remote(num_cpus=1, max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS)(
            TranscribeActor
        )
        idle = [actor_class.remote(spec) for _ in range(max(1, min(workers, len(work))))]
        pending = list(reversed(work))
        running: dict = {}  # object ref -> (actor, task)
        while pending or running:
            while idle and pending:
                actor, task = idle.pop(), pending.pop()
                running[actor.transcribe.remote(*task)] = (actor, task)
            (ref,), _ = ray.wait(list(running), num_returns=1)
            actor, task = running.pop(ref)
            try:
                record = ray.get(ref)
            except ray.exceptions.RayError as err:  # retries spent: record it, replace the actor, go on
                record = {
                    "path": task[0].path,
                    "error": f"{task[0].path}: Ray task failed ({type(err).__name__})",
                }
                actor = actor_class.remote(spec)
            idle.append(actor)
            on_record(record)
    finally:
        if started_here:
            ray.shutdown()
