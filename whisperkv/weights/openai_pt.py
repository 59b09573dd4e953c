"""OpenAI ``.pt`` checkpoints: ``{"dims": {...}, "model_state_dict": {...}}``, already in our naming.

Files we write also carry an ``alignment_heads`` key, which openai-whisper ignores, so one exported
file serves both engines. The vocabulary is a ``tokenizer.json`` beside the file, or else the packaged
one that matches the model's vocabulary size.
"""

from __future__ import annotations

from pathlib import Path

import torch

from whisperkv.errors import ModelLoadError
from whisperkv.model.dims import ModelDims
from whisperkv.weights.checkpoint import Checkpoint
from whisperkv.weights.mapped import MappedPages


def load_openai_pt(path: str | Path, widen: bool = True) -> Checkpoint:
    """The checkpoint, its tensors widened to float32 (``widen`` False: as stored, for a load that widens
    them a block at a time, ``cpu/quantize.py``).

    The file is memory-mapped where its format allows (``weights/mapped.py``): widened, each tensor's
    pages are handed back at once; kept (``widen`` False), its float16 tensors stay views of the file
    and ``extra["mapped"]`` says where, for the loader to hand their pages back as it converts them;
    any other tensor is copied out of the map now, so no tensor a model keeps is a view of the file."""
    path = Path(path)
    data, pages = _read(path)
    if not isinstance(data, dict) or "dims" not in data or "model_state_dict" not in data:
        raise ModelLoadError(
            f"{path}: not an OpenAI Whisper checkpoint (needs 'dims' and 'model_state_dict')"
        )
    stored_sd = data["model_state_dict"]
    stored = str(next(iter(stored_sd.values())).dtype).replace("torch.", "")
    sd = _widened(stored_sd, pages) if widen else _kept_float16(stored_sd, pages)
    heads = data.get("alignment_heads")
    return Checkpoint(
        dims=ModelDims(**data["dims"]),
        state_dict=sd,
        alignment_heads=[tuple(h) for h in heads] if heads else None,
        tokenizer_path=path.parent / "tokenizer.json" if (path.parent / "tokenizer.json").is_file() else None,
        source=str(path),
        format="openai-pt",
        stored_dtype=stored,
        extra={"mapped": pages} if pages is not None and not widen else {},
    )


def _read(path: Path) -> tuple[object, MappedPages | None]:
    """``torch.load`` of the file, memory-mapped where it is a zip-format file (every ``torch.save`` since
    PyTorch 1.6) and its state dict lies in one private map of it; else read whole (the legacy format).
    Returns the data and the map's pages (None: read whole)."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file
        if not (isinstance(exc, RuntimeError) and "mmap can only be used" in str(exc)):
            raise _unreadable(path, exc) from exc
    else:
        stored = data.get("model_state_dict") if isinstance(data, dict) else None
        if not isinstance(stored, dict):
            return data, None  # not a Whisper checkpoint: the caller says so
        pages = MappedPages.of(stored.values(), path)
        if pages is not None:
            return data, pages
        del data, stored  # a map that cannot be handed back page by page: read whole instead
    try:
        return torch.load(path, map_location="cpu", weights_only=True), None
    except Exception as exc:  # noqa: BLE001
        raise _unreadable(path, exc) from exc


def _unreadable(path: Path, exc: Exception) -> ModelLoadError:
    return ModelLoadError(f"{path}: not a readable PyTorch checkpoint ({exc.__class__.__name__})")


def _widened(stored: dict[str, torch.Tensor], pages: MappedPages | None) -> dict[str, torch.Tensor]:
    """Every tensor as float32, each stored (float16) one dropped as soon as it is widened: the load's
    peak holds the float32 weights and one stored tensor, not all of both (``torch.load`` gives every
    tensor a storage of its own; large-v3-turbo: 3.2 GB of float32 beside 1.6 GB of float16 before).
    From a map, every tensor is a copy (a float32 one too) and its pages are handed back."""
    sd = {}
    for name in list(stored):
        tensor = stored.pop(name)
        if tensor.is_floating_point():
            sd[name] = tensor.to(torch.float32, copy=pages is not None)
        else:
            sd[name] = tensor.clone() if pages is not None else tensor
        if pages is not None:
            pages.drop(tensor)
        del tensor
    return sd


def _kept_float16(stored: dict[str, torch.Tensor], pages: MappedPages | None) -> dict[str, torch.Tensor]:
    """The tensors as stored; from a map, float16 ones stay views of it (the int8 load converts each and
    hands its pages back) and any other is copied out now, its pages handed back."""
    if pages is None:
        return stored
    for name, tensor in stored.items():
        if tensor.dtype != torch.float16:
            stored[name] = tensor.clone()
            pages.drop(tensor)
    return stored


def save_openai_pt(checkpoint: Checkpoint, path: str | Path, dtype: torch.dtype = torch.float32) -> None:
    sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in checkpoint.state_dict.items()}
    payload = {"dims": checkpoint.dims.to_dict(), "model_state_dict": sd}
    if checkpoint.alignment_heads:
        payload["alignment_heads"] = [list(h) for h in checkpoint.alignment_heads]
    torch.save(payload, path)
