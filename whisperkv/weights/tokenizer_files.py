"""Vocabulary files that no package ships but a model size needs: large-v3's 100-language tokenizer.json.

The 100-language vocabulary (51,866 ids: large-v3, large-v3-turbo) is the 99-language one (base's, which
the ``multilingual`` extra installs) with ``<|yue|>`` after ``<|su|>`` and every later special id one
higher. It is derived from that file, written once to the cache directory (``$WHISPERKV_CACHE``, else
``$XDG_CACHE_HOME/whisperkv``, else ``~/.cache/whisperkv``) and checked byte for byte on every use, so a
stale or altered copy is rewritten rather than trusted.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

HUNDRED_LANGUAGES_NAME = "tokenizer-100-languages.json"


def hundred_language_vocabulary(base_tokenizer: Path) -> bytes:
    """large-v3's tokenizer.json, as bytes, from the 99-language one."""
    data = json.loads(base_tokenizer.read_text(encoding="utf-8"))
    su = next(entry["id"] for entry in data["added_tokens"] if entry["content"] == "<|su|>")
    moved = []
    for entry in data["added_tokens"]:
        if entry["id"] > su:
            entry = {**entry, "id": entry["id"] + 1}
        moved.append(entry)
        if entry["content"] == "<|su|>":
            moved.append({**entry, "id": su + 1, "content": "<|yue|>"})
    data["added_tokens"] = moved
    vocab = data["model"]["vocab"]
    for entry in moved:
        if entry["content"] in vocab or entry["id"] > su:
            vocab[entry["content"]] = entry["id"]
    return json.dumps(data, ensure_ascii=False).encode("utf-8")


def write_hundred_language_tokenizer(base_tokenizer: Path, destination: Path) -> Path:
    """Write large-v3's tokenizer.json to ``destination`` (atomically) unless it already holds it."""
    content = hundred_language_vocabulary(base_tokenizer)
    if destination.is_file() and destination.read_bytes() == content:
        return destination
    destination.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=destination.parent, prefix=".tokenizer-", suffix=".json")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(content)
        os.chmod(temporary, 0o644)
        os.replace(temporary, destination)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return destination


def _cache_dir() -> Path:
    if os.environ.get("WHISPERKV_CACHE"):
        return Path(os.environ["WHISPERKV_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "whisperkv"


def hundred_language_tokenizer(base_tokenizer: Path) -> Path:
    """The cached 100-language tokenizer.json (a private temporary one where the cache is not writable)."""
    try:
        return write_hundred_language_tokenizer(base_tokenizer, _cache_dir() / HUNDRED_LANGUAGES_NAME)
    except OSError:
        private = Path(tempfile.mkdtemp(prefix="whisperkv-tokenizer-"))
        return write_hundred_language_tokenizer(base_tokenizer, private / HUNDRED_LANGUAGES_NAME)
