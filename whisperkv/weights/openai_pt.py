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


def load_openai_pt(path: str | Path, widen: bool = True) -> Checkpoint:
    """The checkpoint, its tensors widened to float32 (``widen`` False: as stored, for a load that widens
    them a block at a time, ``cpu/quantize.py``)."""
    path = Path(path)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file
        raise ModelLoadError(f"{path}: not a readable PyTorch checkpoint ({exc.__class__.__name__})") from exc
    if not isinstance(data, dict) or "dims" not in data or "model_state_dict" not in data:
        raise ModelLoadError(
            f"{path}: not an OpenAI Whisper checkpoint (needs 'dims' and 'model_state_dict')"
        )
    stored_sd = data["model_state_dict"]
    stored = str(next(iter(stored_sd.values())).dtype).replace("torch.", "")
    sd = _widened(stored_sd) if widen else stored_sd
    heads = data.get("alignment_heads")
    return Checkpoint(
        dims=ModelDims(**data["dims"]),
        state_dict=sd,
        alignment_heads=[tuple(h) for h in heads] if heads else None,
        tokenizer_path=path.parent / "tokenizer.json" if (path.parent / "tokenizer.json").is_file() else None,
        source=str(path),
        format="openai-pt",
        stored_dtype=stored,
    )


def _widened(stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every tensor as float32, each stored (float16) one dropped as soon as it is widened: the load's
    peak holds the float32 weights and one stored tensor, not all of both (``torch.load`` gives every
    tensor a storage of its own; large-v3-turbo: 3.2 GB of float32 beside 1.6 GB of float16 before)."""
    sd = {}
    for name in list(stored):
        tensor = stored.pop(name)
        sd[name] = tensor.float() if tensor.is_floating_point() else tensor
        del tensor
    return sd


def save_openai_pt(checkpoint: Checkpoint, path: str | Path, dtype: torch.dtype = torch.float32) -> None:
    sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in checkpoint.state_dict.items()}
    payload = {"dims": checkpoint.dims.to_dict(), "model_state_dict": sd}
    if checkpoint.alignment_heads:
        payload["alignment_heads"] = [list(h) for h in checkpoint.alignment_heads]
    torch.save(payload, path)
