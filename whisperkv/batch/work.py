"""One file of a batch job, start to finish: read, transcribe, write its outputs, describe it in a record.

Both engines (local processes and Ray actors) run exactly this function, so a file gives the same
transcript and the same record wherever it ran. A failure is a record with an ``error``, never an
exception that would stop the job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from whisperkv.audio import SAMPLE_RATE
from whisperkv.audio_source import open_source
from whisperkv.batch.ledger import file_sha256, options_digest
from whisperkv.errors import WhisperKVError
from whisperkv.writers import SUPPORTED_FORMATS, render, write_atomic

if TYPE_CHECKING:
    from whisperkv.batch.inputs import BatchItem
    from whisperkv.model.whisper import Whisper


@dataclass(frozen=True)
class JobSpec:
    """Everything a worker needs to redo any file of the job: picklable, the same on every worker."""

    model: str
    compute_type: str
    options: dict[str, Any]
    output_dir: str
    output_format: str = "all"
    writer_options: dict[str, Any] = field(default_factory=dict)
    threads: int = 0

    def load_model(self) -> Whisper:
        import torch

        from whisperkv.load import load_model

        if self.threads:
            torch.set_num_threads(self.threads)
        return load_model(self.model, compute_type=self.compute_type)

    def file_options(self, item: BatchItem) -> dict[str, Any]:
        """The transcribe() options for one file: the job's, with the manifest's language if it gave one."""
        options = dict(self.options)
        if item.language:
            options["language"] = item.language
        return options


def _version() -> str:
    from whisperkv import __version__

    return __version__


def transcribe_item(
    model: Whisper,
    spec: JobSpec,
    item: BatchItem,
    stem: str,
    before_write: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Transcribe one file and stage its outputs (``publish_outputs`` puts them in place once the record
    is in ``results.jsonl``); return its record (or its error). ``before_write`` runs just before the
    outputs are written: a local worker exits there if its parent has died."""
    options = spec.file_options(item)
    record: dict[str, Any] = {
        "path": item.path,
        "audio_sha256": None,
        "duration": None,
        "weights_digest": model.weights_digest,
        "whisperkv_version": _version(),
        "model": spec.model,
        "options": options,
        "options_digest": options_digest(options),
        "language": None,
        "text": None,
        "segments": None,
        "outputs": [],
        "seconds": None,
        "worker": os.getpid(),
        "error": None,
    }
    started = time.perf_counter()
    try:
        record["audio_sha256"] = file_sha256(item.path)
        source = open_source(item.path, model.dims.n_mels)
        record["duration"] = round(source.n_samples / SAMPLE_RATE, 3)
        result = model.transcribe(source, verbose=None, **options)
        record["language"] = result["language"]
        record["text"] = result["text"]
        record["segments"] = result["segments"]
        if before_write is not None:
            before_write()
        record["outputs"] = write_outputs(result, spec, stem, staged=True)
    except WhisperKVError as err:
        record["error"] = str(err) if item.path in str(err) else f"{item.path}: {err}"
    except OSError as err:
        record["error"] = f"{item.path}: {err.strerror or err}"
    except Exception as err:  # one file's unexpected failure must not end the job: record it, go on
        record["error"] = f"{item.path}: {type(err).__name__}: {err}"
    record["seconds"] = round(time.perf_counter() - started, 3)
    return record


#: how a staged output is named: hidden, beside the output it becomes (``.jfk.txt.pending``)
STAGED_SUFFIX = ".pending"


def staged_path(path: str) -> str:
    directory, name = os.path.split(path)
    return os.path.join(directory, f".{name}{STAGED_SUFFIX}")


def write_outputs(result: dict, spec: JobSpec, stem: str, staged: bool = False) -> list[str]:
    """Render every requested format first, then write them atomically (all or nothing); return the
    outputs' paths. ``staged``: written under their ``staged_path`` names, for ``publish_outputs``."""
    formats = SUPPORTED_FORMATS if spec.output_format == "all" else (spec.output_format,)
    texts = [(fmt, render(result, fmt, spec.writer_options)) for fmt in formats]
    paths = []
    for fmt, text in texts:
        path = os.path.join(spec.output_dir, f"{stem}.{fmt}")
        write_atomic(staged_path(path) if staged else path, text)
        paths.append(path)
    return paths


def publish_outputs(record: dict) -> None:
    """Rename a recorded file's staged outputs into place. Called once its line is in ``results.jsonl``,
    so every output has a line: a run killed before this leaves only hidden staged files (its next run
    redoes the file), one killed during it has the line (its next run rewrites the outputs from it)."""
    for path in record.get("outputs") or []:
        try:
            os.replace(staged_path(path), path)
        except FileNotFoundError:
            pass  # written by a Ray actor on a machine without this folder: the record has the text


def discard_staged(output_dir: str) -> None:
    """Remove staged outputs a killed run left behind (their files have no line: they are redone)."""
    try:
        names = os.listdir(output_dir)
    except OSError:
        return
    for name in names:
        if name.startswith(".") and name.endswith(STAGED_SUFFIX):
            try:
                os.unlink(os.path.join(output_dir, name))
            except OSError:
                pass


def same_transcript(a: dict, b: dict) -> str | None:
    """None when two records hold the same transcript; else what differs (for ``--verify``)."""
    if a.get("error") or b.get("error"):
        return f"error: {a.get('error') or b.get('error')}"
    if a["text"] != b["text"]:
        return "text differs"
    keys = ("start", "end", "text", "tokens")
    for i, (x, y) in enumerate(zip(a["segments"], b["segments"])):
        for key in keys:
            if x.get(key) != y.get(key):
                return f"segment {i} {key} differs"
    if len(a["segments"]) != len(b["segments"]):
        return f"{len(a['segments'])} vs {len(b['segments'])} segments"
    return None
