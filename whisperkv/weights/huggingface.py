"""Hugging Face transformers Whisper directories: ``config.json`` + ``model.safetensors``, read.

transformers names the same tensors differently (``model.encoder.layers.0.self_attn.q_proj``); this
module owns the two-way name map, so the model class only ever sees OpenAI names. Writing such a
directory (the weights, the tokenizer and the other configs transformers needs) is
``weights/huggingface_save.py``: reading needs no tokenizer, and the registry that imports this reader is
itself imported by the tokenizer (for the packaged tokenizer.json files).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from whisperkv.errors import ModelLoadError
from whisperkv.model.dims import ModelDims
from whisperkv.weights.checkpoint import Checkpoint, directory_checkpoint

_ATTN = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "out": "out_proj"}


def _block_map(side: str, i: int, decoder: bool) -> dict[str, str]:
    ours, theirs = f"{side}.blocks.{i}", f"model.{side}.layers.{i}"
    m: dict[str, str] = {}
    attns = [("attn", "self_attn")] + ([("cross_attn", "encoder_attn")] if decoder else [])
    for o, t in attns:
        for proj, hf in _ATTN.items():
            m[f"{ours}.{o}.{proj}.weight"] = f"{theirs}.{t}.{hf}.weight"
            if proj != "key":
                m[f"{ours}.{o}.{proj}.bias"] = f"{theirs}.{t}.{hf}.bias"
        for p in ("weight", "bias"):
            m[f"{ours}.{o}_ln.{p}"] = f"{theirs}.{t}_layer_norm.{p}"
    for p in ("weight", "bias"):
        m[f"{ours}.mlp.0.{p}"] = f"{theirs}.fc1.{p}"
        m[f"{ours}.mlp.2.{p}"] = f"{theirs}.fc2.{p}"
        m[f"{ours}.mlp_ln.{p}"] = f"{theirs}.final_layer_norm.{p}"
    return m


def name_map(dims: ModelDims) -> dict[str, str]:
    """OpenAI name → transformers name, for every tensor of a model with these dims."""
    m = {
        "encoder.positional_embedding": "model.encoder.embed_positions.weight",
        "decoder.positional_embedding": "model.decoder.embed_positions.weight",
        "decoder.token_embedding.weight": "model.decoder.embed_tokens.weight",
    }
    for p in ("weight", "bias"):
        m[f"encoder.conv1.{p}"] = f"model.encoder.conv1.{p}"
        m[f"encoder.conv2.{p}"] = f"model.encoder.conv2.{p}"
        m[f"encoder.ln_post.{p}"] = f"model.encoder.layer_norm.{p}"
        m[f"decoder.ln.{p}"] = f"model.decoder.layer_norm.{p}"
    for i in range(dims.n_audio_layer):
        m.update(_block_map("encoder", i, decoder=False))
    for i in range(dims.n_text_layer):
        m.update(_block_map("decoder", i, decoder=True))
    return m


def _dims_from_config(cfg: dict) -> ModelDims:
    return ModelDims(
        n_mels=cfg["num_mel_bins"],
        n_audio_ctx=cfg["max_source_positions"],
        n_audio_state=cfg["d_model"],
        n_audio_head=cfg["encoder_attention_heads"],
        n_audio_layer=cfg["encoder_layers"],
        n_vocab=cfg["vocab_size"],
        n_text_ctx=cfg["max_target_positions"],
        n_text_state=cfg["d_model"],
        n_text_head=cfg["decoder_attention_heads"],
        n_text_layer=cfg["decoder_layers"],
    )


def is_huggingface_dir(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def load_huggingface(path: str | Path) -> Checkpoint:
    path = Path(path)
    try:
        cfg = json.loads((path / "config.json").read_text())
        dims = _dims_from_config(cfg)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"{path}: config.json is not a Whisper transformers config ({exc})") from exc
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    sd: dict[str, torch.Tensor] = {}
    for ours, theirs in name_map(dims).items():
        if theirs not in tensors:
            raise ModelLoadError(f"{path}: missing tensor {theirs}")
        t = tensors[theirs]
        sd[ours] = t.float() if t.is_floating_point() else t
    stored = str(tensors["model.decoder.embed_tokens.weight"].dtype).replace("torch.", "")
    return directory_checkpoint(path, dims, sd, cfg.get("alignment_heads"), "huggingface", stored)
