"""The network: dimensions, attention, encoder, decoder, and the Whisper module that joins them."""

from __future__ import annotations

import torch

from whisperkv.model.dims import KNOWN_DIMS, ModelDims
from whisperkv.model.whisper import Whisper
from whisperkv.weights import Checkpoint, load_checkpoint

__all__ = ["KNOWN_DIMS", "ModelDims", "Whisper", "load_model", "model_from_checkpoint"]


def model_from_checkpoint(
    ckpt: Checkpoint, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> Whisper:
    with torch.device("meta"):  # no throwaway random init: the loaded tensors become the parameters
        model = Whisper(ckpt.dims)
    model.load_state_dict(ckpt.state_dict, strict=True, assign=True)
    model.alignment_heads = ckpt.alignment_heads
    model.tokenizer_path = ckpt.tokenizer_path
    model.name = ckpt.extra.get("name", "")
    model.source = ckpt.source
    model.requires_grad_(False)
    model = model.to(device=device, dtype=dtype).eval()
    model.fuse_qkv()
    return model


def load_model(
    name_or_path: str = "tiny.en",
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = None,
    download_root: str | None = None,
    compute_type: str = "default",
) -> Whisper:
    """Load a model by name ("tiny.en", "base") or path, like ``whisper.load_model``.

    ``dtype`` defaults to float32 on CPU and float16 on CUDA. ``compute_type="int8"`` quantises the
    linear layers (CPU only; an approximation whose agreement is measured, see ``model/quantize.py``);
    "float32"/"float16"/"bfloat16" set the dtype. ``download_root`` is accepted for compatibility and
    ignored: whisperkv never downloads.
    """
    if compute_type in ("float32", "float16", "bfloat16"):
        dtype = compute_type
    elif compute_type not in ("default", "int8"):
        raise ValueError(
            f"unknown compute_type {compute_type!r}: default, float32, float16, bfloat16 or int8"
        )
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    if dtype is None:
        dtype = torch.float16 if str(device).startswith("cuda") else torch.float32
    model = model_from_checkpoint(load_checkpoint(name_or_path), device=device, dtype=dtype)
    if compute_type == "int8":
        from whisperkv.model.quantize import quantize_int8

        quantize_int8(model)
    return model
