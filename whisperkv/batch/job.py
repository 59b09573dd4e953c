"""A whole batch job: skip what is provably done, run the rest on an engine, record
every file, optionally re-check a sample, and summarise.

The data path, top to bottom:
1. inputs → files (folders searched, manifests read: ``expand_inputs``, which the command runs before
   the model loads), each with a unique output name;
2. for each file, its audio SHA-256 and its options' digest; a file whose ``results.jsonl`` line has the
   same audio, weights and options is skipped (its outputs are rewritten from the record if missing);
3. the rest go to the local or the Ray engine; each finished file appends its record at once, and only
   then are its outputs (written aside by the worker) renamed into place;
4. ``verify`` re-transcribes a sample of done files here and compares transcripts.
"""

from __future__ import annotations

import os
import random
import tempfile
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from whisperkv.batch.inputs import BatchItem, output_stems
from whisperkv.batch.ledger import Ledger, file_sha256, options_digest
from whisperkv.batch.progress import Progress
from whisperkv.batch.work import (
    JobSpec,
    discard_staged,
    publish_outputs,
    same_transcript,
    transcribe_item,
    write_outputs,
)

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper


@dataclass
class BatchReport:
    summary: dict
    verified: list[tuple[str, str | None]]  # (path, None when identical, else what differs)


def _already_done(ledger: Ledger, spec: JobSpec, item: BatchItem, weights_digest: str) -> dict | None:
    try:
        sha = file_sha256(item.path)
    except OSError:
        return None  # unreadable now: let the worker record the error
    return ledger.done(item.path, sha, weights_digest, options_digest(spec.file_options(item)))


def _restore_outputs(record: dict, spec: JobSpec, stem: str) -> None:
    """A skipped file whose outputs were deleted (or asked in a new format) gets them from its record."""
    formats = ("txt", "vtt", "srt", "tsv", "json") if spec.output_format == "all" else (spec.output_format,)
    if all(os.path.exists(os.path.join(spec.output_dir, f"{stem}.{fmt}")) for fmt in formats):
        return
    result = {"text": record["text"], "segments": record["segments"], "language": record["language"]}
    write_outputs(result, spec, stem)


def run_batch(
    items: list[BatchItem],
    spec: JobSpec,
    model: Whisper,
    engine: str = "local",
    workers: int = 1,
    ray_address: str | None = None,
    verify: int = 0,
) -> BatchReport:
    """Run the job on ``items`` (``expand_inputs``); ``model`` (loaded from ``spec``) gives the weights
    digest and serves ``verify``."""
    stems = output_stems(items)
    os.makedirs(spec.output_dir, exist_ok=True)
    ledger = Ledger.open(spec.output_dir)  # a last line cut by a crash is dropped here: that file is redone
    discard_staged(spec.output_dir)
    progress = Progress(len(items))
    todo = []
    for item in items:
        record = _already_done(ledger, spec, item, model.weights_digest)
        if record is None:
            todo.append((item, stems[item.path]))
        else:
            _restore_outputs(record, spec, stems[item.path])
            progress.add(record, skipped=True)

    def on_record(record: dict) -> None:
        ledger.append(record)  # the line first, then the outputs: no output is ever without its line
        publish_outputs(record)
        progress.add(record)

    try:
        if engine == "ray":
            from whisperkv.batch.ray_engine import run_ray

            run_ray(spec, todo, workers, on_record, ray_address)
        elif workers <= 1:
            for item, stem in todo:  # the model already loaded here serves: no second copy
                on_record(transcribe_item(model, spec, item, stem))
        else:
            from whisperkv.batch.local import run_local

            run_local(spec, todo, workers, on_record)
    finally:
        summary = progress.close()
    return BatchReport(summary, verify_sample(ledger, spec, model, items, stems, verify))


def verify_sample(
    ledger: Ledger, spec: JobSpec, model: Whisper, items: list[BatchItem], stems: dict[str, str], k: int
) -> list[tuple[str, str | None]]:
    """Re-transcribe ``k`` done files (a fixed-seed sample) and compare with their records."""
    done = [item for item in items if _already_done(ledger, spec, item, model.weights_digest) is not None]
    if k <= 0 or not done:
        return []
    sample = random.Random(0).sample(done, min(k, len(done)))
    outcomes = []
    with tempfile.TemporaryDirectory() as scratch:
        scratch_spec = replace(spec, output_dir=scratch)
        for item in sample:
            again = transcribe_item(model, scratch_spec, item, stems[item.path])
            recorded = ledger.records[os.path.abspath(item.path)]
            outcomes.append((item.path, same_transcript(recorded, again)))
    return outcomes
