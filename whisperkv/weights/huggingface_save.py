"""Write a Hugging Face transformers Whisper directory: ``model.safetensors`` under transformers' tensor
names, ``config.json``, and (when the checkpoint has a tokenizer) the tokenizer and the other configs
transformers needs (``weights/transformers_files.py``).

Apart from the reader (``weights/huggingface.py``) because writing needs the tokenizer and the reader
does not: the model registry imports the reader, and the tokenizer imports the registry.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from whisperkv.weights.checkpoint import Checkpoint
from whisperkv.weights.huggingface import name_map
from whisperkv.weights.transformers_files import write_transformers_files


def save_huggingface(checkpoint: Checkpoint, path: str | Path, dtype: torch.dtype = torch.float32) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dims = checkpoint.dims
    tensors = {
        theirs: checkpoint.state_dict[ours].to(dtype).contiguous() for ours, theirs in name_map(dims).items()
    }
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    eot = 50257 if dims.is_multilingual else 50256
    cfg = {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "d_model": dims.n_audio_state,
        "encoder_layers": dims.n_audio_layer,
        "encoder_attention_heads": dims.n_audio_head,
        "encoder_ffn_dim": 4 * dims.n_audio_state,
        "decoder_layers": dims.n_text_layer,
        "decoder_attention_heads": dims.n_text_head,
        "decoder_ffn_dim": 4 * dims.n_text_state,
        "num_mel_bins": dims.n_mels,
        "vocab_size": dims.n_vocab,
        "max_source_positions": dims.n_audio_ctx,
        "max_target_positions": dims.n_text_ctx,
        "activation_function": "gelu",
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "eos_token_id": eot,
        "bos_token_id": eot,
        "pad_token_id": eot,
        "decoder_start_token_id": eot + 1,
        "torch_dtype": str(dtype).replace("torch.", ""),
    }
    if checkpoint.alignment_heads:
        cfg["alignment_heads"] = [list(h) for h in checkpoint.alignment_heads]
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    if (
        checkpoint.tokenizer_path
    ):  # the tokenizer, feature extractor and generation configs transformers reads
        write_transformers_files(Path(checkpoint.tokenizer_path), path, dims, checkpoint.alignment_heads)
