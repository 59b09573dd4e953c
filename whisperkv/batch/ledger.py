"""``results.jsonl``: one line per file, the job's memory across runs.

A line records what produced a transcript (audio SHA-256, weights digest, whisperkv version, options)
next to the transcript itself, so a rerun can prove a file is already done — same audio bytes, same
weights, same options — and skip it, and ``--verify`` can redo a sample and compare. Lines are only
appended (a crash loses at most the line being written, which the next run drops before it appends);
when a file has several lines the last wins.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

LEDGER_NAME = "results.jsonl"


def options_digest(options: dict[str, Any]) -> str:
    """A short digest of the options that decide a transcript (canonical JSON, sorted keys)."""
    canonical = json.dumps(options, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def file_sha256(path: str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Ledger:
    """The lines of ``DIR/results.jsonl``, indexed by absolute path (last line wins)."""

    path: str
    records: dict[str, dict] = field(default_factory=dict)
    unreadable_lines: int = 0
    repaired: bool = False  # a cut last line was dropped when the ledger was opened

    @classmethod
    def open(cls, output_dir: str) -> Ledger:
        """Read the ledger, first dropping a last line that a crash cut short (``repair``)."""
        ledger = cls(os.path.join(output_dir, LEDGER_NAME))
        if os.path.exists(ledger.path):
            ledger.repaired = repair(ledger.path)
            with open(ledger.path, encoding="utf-8") as f:
                for line in f:
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:
                        ledger.unreadable_lines += 1  # a line cut short by a crash: that file is redone
                        continue
                    if isinstance(record, dict) and "path" in record:
                        ledger.records[os.path.abspath(record["path"])] = record
        return ledger

    def done(self, path: str, audio_sha256: str, weights_digest: str, options: str) -> dict | None:
        """The record that proves ``path`` is done with exactly these inputs, or None."""
        record = self.records.get(os.path.abspath(path))
        if record is None or record.get("error"):
            return None
        same = (
            record.get("audio_sha256") == audio_sha256
            and record.get("weights_digest") == weights_digest
            and record.get("options_digest") == options
        )
        return record if same else None

    def append(self, record: dict) -> None:
        """Add one line, flushed to disk before returning (a crash keeps every finished file)."""
        line = json.dumps(record, ensure_ascii=False, default=_plain)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.records[os.path.abspath(record["path"])] = record


def repair(path: str) -> bool:
    """Drop a last line without its newline (a write cut by a crash) so the next append starts a line of
    its own; True when one was dropped. Glued onto the cut text, the next record would be unreadable
    too, and its file redone on every run. The dropped line's file has no record: it is redone."""
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return False
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return False
        keep = 0  # the bytes up to the last newline, found reading backwards a block at a time
        position = size
        while position > 0:
            start = max(0, position - (1 << 16))
            f.seek(start)
            block = f.read(position - start)
            newline = block.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            position = start
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
    return True


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
