"""Random weights with the real dimensions of any Whisper size, drawn from a seed: no download.

Speed and correctness at a size are decided by its shapes, not by what its weights learned, so a model
the size of small, medium, large-v3 or large-v3-turbo can be checked against the reference and timed
beside the peers without fetching a checkpoint. The tensors are drawn from one seeded generator in the
state dict's order, rounded to float16 values (as every released checkpoint is stored, so the fast
paths that hold float16-exact matrices in float16 are the ones exercised), with LayerNorms at one and
zero and the encoder's sinusoidal positions as Whisper computes them.

``write_random_model(name_or_dims, directory)`` writes ``model.pt`` (OpenAI's format: openai-whisper and
whisperkv load the same tensors) and, for a 100-language vocabulary, the ``tokenizer.json`` it needs.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from whisperkv.model.dims import KNOWN_DIMS, ModelDims
from whisperkv.model.whisper import Whisper
from whisperkv.weights.checkpoint import Checkpoint
from whisperkv.weights.openai_pt import save_openai_pt
from whisperkv.weights.registry import default_tokenizer_path
from whisperkv.weights.tokenizer_files import write_hundred_language_tokenizer

#: standard deviation of the random linear and embedding weights: activations stay O(1) through 32 layers
WEIGHT_STD = 0.02
#: standard deviation of the token table: wider, so a step's top two logits rarely sit within float noise
EMBEDDING_STD = 0.05


def resolve_dims(name_or_dims: str | ModelDims) -> ModelDims:
    """The dimensions of a released size by name, or the given dimensions."""
    if isinstance(name_or_dims, ModelDims):
        return name_or_dims
    if name_or_dims not in KNOWN_DIMS:
        known = ", ".join(sorted(KNOWN_DIMS))
        raise ValueError(f"unknown model size {name_or_dims!r}: one of {known}")
    return KNOWN_DIMS[name_or_dims]


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """The encoder's fixed positional embedding, as openai-whisper computes it."""
    log_timescale_increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-log_timescale_increment * torch.arange(channels // 2))
    scaled_time = torch.arange(length)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


def _shapes(dims: ModelDims) -> dict[str, torch.Size]:
    """Every tensor of the model's state dict (OpenAI naming) with its shape, without allocating it."""
    with torch.device("meta"):
        model = Whisper(dims)
    return {name: tensor.shape for name, tensor in model.state_dict().items()}


def _is_norm(name: str) -> bool:
    """A LayerNorm's tensor: ``attn_ln``, ``cross_attn_ln``, ``mlp_ln``, ``ln_post``, the decoder's ``ln``."""
    module = name.rsplit(".", 2)[-2]
    return module == "ln" or module == "ln_post" or module.endswith("_ln")


def _draw(name: str, shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    if _is_norm(name):
        return torch.ones(shape) if name.endswith(".weight") else torch.zeros(shape)
    std = EMBEDDING_STD if name == "decoder.token_embedding.weight" else WEIGHT_STD
    values = torch.randn(shape, generator=generator) * std
    return values.half().float()  # float16 values, as released checkpoints hold


def random_checkpoint(name_or_dims: str | ModelDims, seed: int = 0) -> Checkpoint:
    """A checkpoint of random float16-exact tensors for ``name_or_dims``, the same for the same seed."""
    dims = resolve_dims(name_or_dims)
    generator = torch.Generator().manual_seed(seed)
    state_dict: dict[str, torch.Tensor] = {}
    for name, shape in _shapes(dims).items():
        if name == "encoder.positional_embedding":
            state_dict[name] = sinusoids(dims.n_audio_ctx, dims.n_audio_state).half().float()
        else:
            state_dict[name] = _draw(name, shape, generator)
    label = name_or_dims if isinstance(name_or_dims, str) else "custom"
    return Checkpoint(
        dims=dims,
        state_dict=state_dict,
        source=f"random:{label}:seed={seed}",
        format="random",
        stored_dtype="float16",
        extra={"name": f"random-{label}"},
    )


def write_random_model(name_or_dims: str | ModelDims, directory: str | Path, seed: int = 0) -> Path:
    """``directory/model.pt`` with random weights (stored in float16, as released checkpoints are), and
    its tokenizer.json.

    Returns the ``.pt`` path, which ``whisperkv.load_model`` and ``whisper.load_model`` both read.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    checkpoint = random_checkpoint(name_or_dims, seed)

    dims = checkpoint.dims
    if dims.is_multilingual and dims.num_languages == 100:
        base = default_tokenizer_path(KNOWN_DIMS["base"])
        write_hundred_language_tokenizer(base, directory / "tokenizer.json")
    path = directory / "model.pt"
    save_openai_pt(checkpoint, path, dtype=torch.float16)
    return path
