"""``whisperkv convert``: load weights in any supported format, write them as .pt or safetensors.

The written files load back into whisperkv, and the .pt file also loads into openai-whisper
(``whisper.load_model(path)``), which is how the parity tests share weights with the reference.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

import torch

from whisperkv.weights.huggingface_save import save_huggingface
from whisperkv.weights.openai_pt import save_openai_pt
from whisperkv.weights.registry import default_tokenizer_path, load_checkpoint


def _new_file(directory: Path, suffix: str) -> Path:
    """A new empty file in ``directory``, mode 0o666 less the umask (``mkstemp`` would force 0o600)."""
    while True:
        path = directory / f".convert-{secrets.token_hex(6)}{suffix}"
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return path
        except FileExistsError:  # pragma: no cover - a 48-bit name collision
            continue


def _new_dir(parent: Path) -> Path:
    """A new empty directory in ``parent``, mode 0o777 less the umask (``mkdtemp`` would force 0o700)."""
    while True:
        path = parent / f".convert-{secrets.token_hex(6)}"
        try:
            path.mkdir(0o777)
            return path
        except FileExistsError:  # pragma: no cover - a 48-bit name collision
            continue


def _umask_files(directory: Path) -> None:
    """Give every file in ``directory`` the mode a new file gets there (safetensors writes 0o600).

    The mode is read off a probe file, so the process-wide umask is never changed (threads are safe).
    """
    probe = _new_file(directory, ".probe")
    try:
        mode = stat.S_IMODE(probe.stat().st_mode)
    finally:
        probe.unlink()
    for path in directory.iterdir():
        os.chmod(path, mode)


def convert(source: str | Path, destination: str | Path, fmt: str, dtype: str = "float32") -> Path:
    """Write ``source`` to ``destination`` in ``fmt`` ("pt" or "safetensors"); returns the output path.

    "safetensors" (or its alias "transformers") writes a complete transformers directory: the weights,
    config.json, a tokenizer.json with every id of the vocabulary, and the tokenizer, feature extractor
    and generation configs, so ``transformers.pipeline("automatic-speech-recognition", model=DIR)`` and
    ``optimum-cli export openvino --model DIR`` read it offline.

    The output appears only once completely written (temporary file or directory, then rename), with
    the permissions the umask gives any other new file.
    """
    ckpt = load_checkpoint(source)
    if ckpt.tokenizer_path is None:
        ckpt.tokenizer_path = default_tokenizer_path(ckpt.dims)
    torch_dtype = getattr(torch, dtype)
    destination = Path(destination)
    if fmt == "pt":
        destination.parent.mkdir(parents=True, exist_ok=True)
        tmp = _new_file(destination.parent, ".pt.partial")
        try:
            save_openai_pt(ckpt, tmp, torch_dtype)
            os.replace(tmp, destination)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    elif fmt in ("safetensors", "transformers"):
        if destination.exists() and any(destination.iterdir()):
            raise ValueError(f"{destination}: destination directory exists and is not empty")
        destination.parent.mkdir(parents=True, exist_ok=True)
        tmp_dir = _new_dir(destination.parent)
        try:
            save_huggingface(ckpt, tmp_dir, torch_dtype)
            _umask_files(tmp_dir)
            if destination.exists():
                destination.rmdir()
            os.replace(tmp_dir, destination)
        finally:
            if tmp_dir.exists():
                for f in tmp_dir.iterdir():
                    f.unlink()
                tmp_dir.rmdir()
    else:
        raise ValueError(f"unknown format {fmt!r}; expected 'pt' or 'safetensors' (alias 'transformers')")
    return destination
