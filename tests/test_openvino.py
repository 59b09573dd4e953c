"""OpenVINO GenAI, the benchmarks' Intel peer, exported offline from whisperkv's own weights
(``benchmarks/openvino_export.py``): its pipeline must hear what whisperkv hears on the same weights, or
a benchmark beside it would time a broken export. The export takes ~40 s a kind on two cores: slow."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import whisperkv
from whisperkv.metrics import normalize_text

from .conftest import SPEECH_DIR, require_oracle

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from openvino_export import export_openvino  # noqa: E402


def test_an_unknown_export_kind_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="unknown OpenVINO export kind 'fp8'.*default, int8"):
        export_openvino("tiny.en", tmp_path, "fp8")
    assert not any(tmp_path.iterdir()), "nothing is written for a refused kind"


@pytest.mark.slow
@pytest.mark.oracle
@pytest.mark.parametrize("kind", ["default", "int8"])
def test_the_exported_pipeline_transcribes_jfk_as_whisperkv_does(kind, tmp_path, tiny_model):
    genai = require_oracle("openvino_genai")
    require_oracle("optimum.intel")
    directory = export_openvino("tiny.en", tmp_path, kind)
    audio = whisperkv.load_audio(SPEECH_DIR / "en" / "jfk.flac")
    pipeline = genai.WhisperPipeline(str(directory), "CPU", INFERENCE_NUM_THREADS=1)
    theirs = normalize_text(pipeline.generate(audio.tolist()).texts[0])
    ours = normalize_text(whisperkv.transcribe(tiny_model, audio, temperature=0.0)["text"])
    assert theirs.split() == ours.split()
    assert len(ours.split()) == 22  # the whole sentence, not an empty or cut-off transcript
