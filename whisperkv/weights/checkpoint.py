"""What every weight loader returns: dimensions, an OpenAI-named state dict, and side facts.

All three formats (CTranslate2, OpenAI ``.pt``, Hugging Face) are translated into one naming, the
one openai-whisper uses (``encoder.blocks.0.attn.query.weight`` ...), so the model class has exactly
one way to receive weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from whisperkv.model.dims import ModelDims


@dataclass
class Checkpoint:
    dims: ModelDims
    state_dict: dict[str, torch.Tensor]
    #: (decoder layer, head) pairs whose cross-attention follows the audio timing; None if unknown
    alignment_heads: list[tuple[int, int]] | None = None
    #: the model's tokenizer.json, when the weights come with one
    tokenizer_path: Path | None = None
    #: where the weights came from and in which format, for provenance and error messages
    source: str = ""
    format: str = ""
    #: storage dtype found in the file (float16, float32, int8 ...)
    stored_dtype: str = ""
    extra: dict = field(default_factory=dict)


def split_fused(weight: torch.Tensor, parts: int) -> list[torch.Tensor]:
    """CTranslate2 fuses Q/K/V (or K/V) projections along the output rows; split them back."""
    rows = weight.shape[0]
    if rows % parts:
        raise ValueError(f"cannot split {rows} rows into {parts} equal projections")
    return list(torch.split(weight, rows // parts, dim=0))


def directory_checkpoint(
    path: Path,
    dims: ModelDims,
    state_dict: dict[str, torch.Tensor],
    alignment_heads: list | None,
    fmt: str,
    stored_dtype: str,
) -> Checkpoint:
    """A checkpoint read from a model directory, with the directory's tokenizer.json when present."""
    tokenizer = path / "tokenizer.json"
    return Checkpoint(
        dims=dims,
        state_dict=state_dict,
        alignment_heads=[tuple(h) for h in alignment_heads] if alignment_heads else None,
        tokenizer_path=tokenizer if tokenizer.is_file() else None,
        source=str(path),
        format=fmt,
        stored_dtype=stored_dtype,
    )
