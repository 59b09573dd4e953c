"""Weight loaders (CTranslate2, OpenAI .pt, transformers) and the offline model registry."""

from whisperkv.weights.checkpoint import Checkpoint
from whisperkv.weights.registry import DEFAULT_MODEL, available_models, load_checkpoint

__all__ = ["Checkpoint", "DEFAULT_MODEL", "available_models", "load_checkpoint"]
