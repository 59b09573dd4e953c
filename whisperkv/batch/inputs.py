"""What a batch job is made of: the audio files named on the command line, found in folders, or listed
in a manifest — each with an optional per-file language, in a stable order.

Expanding the inputs is the only step that can refuse the whole job (a manifest that cannot be read,
a path that does not exist): everything after it fails file by file.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path

#: extensions a folder is searched for (case-insensitive)
AUDIO_EXTENSIONS = frozenset(
    {".wav", ".flac", ".mp3", ".m4a", ".ogg", ".opus", ".webm", ".aac", ".wma", ".mp4", ".mkv", ".aiff"}
)
MANIFEST_EXTENSIONS = frozenset({".txt", ".csv", ".tsv", ".jsonl"})
PATH_COLUMNS = ("path", "file", "audio", "filename")


class InputError(ValueError):
    """An input that cannot become a list of files (bad manifest, missing path): a usage error."""


@dataclass(frozen=True)
class BatchItem:
    """One file of the job: where it is, and the language its manifest gave (None: detect / model's)."""

    path: str
    language: str | None = None


def _manifest_rows(manifest: Path) -> list[tuple[str, str | None]]:
    suffix = manifest.suffix.lower()
    try:
        text = manifest.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{manifest}: cannot read manifest ({err})") from None
    rows: list[tuple[str, str | None]] = []
    if suffix == ".txt":
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                rows.append((line, None))
        return rows
    if suffix == ".jsonl":
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{manifest}:{number}: not JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise InputError(f"{manifest}:{number}: expected a JSON object per line")
            records.append((number, record))
    else:
        reader = csv.DictReader(text.splitlines(), delimiter="\t" if suffix == ".tsv" else ",")
        records = [(number, row) for number, row in enumerate(reader, start=2)]
    for number, record in records:
        column = next((c for c in PATH_COLUMNS if record.get(c)), None)
        if column is None:
            raise InputError(f"{manifest}:{number}: no path column (one of {', '.join(PATH_COLUMNS)})")
        language = record.get("language") or None
        rows.append((str(record[column]), str(language) if language else None))
    return rows


def _is_manifest(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in MANIFEST_EXTENSIONS


def expand_inputs(inputs: list[str]) -> list[BatchItem]:
    """Files as given, folders searched recursively (sorted), manifests read (paths relative to them).

    A file named twice is kept once (the first mention wins, with its language).
    """
    items: list[BatchItem] = []
    for raw in inputs:
        path = Path(raw)
        if _is_manifest(path):
            for entry, language in _manifest_rows(path):
                entry_path = Path(entry)
                if not entry_path.is_absolute():
                    entry_path = path.parent / entry_path
                items.append(BatchItem(str(entry_path), language))
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_EXTENSIONS)
            items.extend(BatchItem(str(p)) for p in found)
        elif path.exists() or path.suffix:
            items.append(BatchItem(str(path)))  # a missing file fails on its own, as a result line
        else:
            raise InputError(f"{raw}: no such file, folder or manifest")
    seen: set[str] = set()
    unique = []
    for item in items:
        key = os.path.abspath(item.path)
        if key not in seen:
            seen.add(key)
            unique.append(item)
    return unique


def output_stems(items: list[BatchItem]) -> dict[str, str]:
    """Each file's output name (without extension): its stem, or stem-N when stems collide.

    Two inputs ``a/jfk.flac`` and ``b/jfk.flac`` must not overwrite each other's outputs; the suffix
    follows the input order, so a rerun of the same job names every file the same way.
    """
    used: set[str] = set()
    stems: dict[str, str] = {}
    for item in items:
        stem = base = Path(item.path).stem or "audio"
        n = 1
        while stem in used:
            n += 1
            stem = f"{base}-{n}"
        used.add(stem)
        stems[item.path] = stem
    return stems
