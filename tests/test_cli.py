"""The command line: outputs per input, and one clear error line (never a traceback) per bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import wave

import numpy as np
import pytest

import whisperkv


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "whisperkv", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def _wav(path, samples: np.ndarray, rate: int = 16000) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((samples * 32767).astype("<i2").tobytes())


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory, speech_dir):
    d = tmp_path_factory.mktemp("inputs")
    (d / "notaudio.wav").write_text("this is not audio\n")
    (d / "truncated.flac").write_bytes((speech_dir / "en" / "jfk.flac").read_bytes()[:20000])
    _wav(d / "zero.wav", np.zeros(0, dtype=np.float32))
    _wav(d / "silence.wav", np.zeros(16000 * 3, dtype=np.float32))
    return d


def test_batch_with_bad_files_keeps_going_and_writes_only_good_outputs(tmp_path, bad_inputs, speech_dir):
    out = tmp_path / "out"
    good = str(speech_dir / "en" / "jfk.flac")
    names = ["missing.wav", "notaudio.wav", "truncated.flac", "zero.wav", "silence.wav"]
    args = [str(bad_inputs / n) for n in names] + [good]
    proc = run_cli(
        "transcribe",
        *args,
        "--output_dir",
        str(out),
        "--output_format",
        "json",
        "--beam_size",
        "None",
        "--best_of",
        "None",
        "--verbose",
        "False",
    )
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("whisperkv: error:")]
    assert "Traceback" not in proc.stderr
    expected = {
        "missing.wav": "file not found",
        "notaudio.wav": "not an audio file",
        "truncated.flac": "truncated or corrupt",
        "zero.wav": "no audio samples",
    }
    assert len(errors) == len(expected)
    for name, reason in expected.items():
        assert any(name in e and reason in e for e in errors), (name, errors)
    assert sorted(p.name for p in out.iterdir()) == ["jfk.json", "silence.json"]  # no partial outputs
    silence = json.loads((out / "silence.json").read_text())
    assert silence["text"] == "" and silence["segments"] == []
    jfk = json.loads((out / "jfk.json").read_text())
    assert "ask not what your country can do for you" in jfk["text"]
    assert "ask not what your country can do for you" in proc.stdout
    assert jfk["cache"]["cross_kv_bytes"] == 2 * 4 * 1500 * 384 * 4


def test_output_format_all_writes_every_writer(tmp_path, speech_dir):
    proc = run_cli(
        "transcribe",
        str(speech_dir / "en" / "lj_LJ001-0008.flac"),
        "--output_dir",
        str(tmp_path),
        "--beam_size",
        "None",
        "--best_of",
        "None",
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".srt", ".tsv", ".txt", ".vtt"]
    assert "surpassed" in (tmp_path / "lj_LJ001-0008.txt").read_text()
    assert "-->" in proc.stdout  # verbose prints timed segments


def test_bad_model_is_one_line_and_exit_2(tmp_path, speech_dir):
    proc = run_cli("transcribe", str(speech_dir / "en" / "jfk.flac"), "--model", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("whisperkv: error: unknown model")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_bad_batch_size_is_a_usage_error(tmp_path, speech_dir):
    proc = run_cli(
        "transcribe",
        str(speech_dir / "en" / "jfk.flac"),
        "--batched",
        "True",
        "--batch_size",
        "0",
        "--output_dir",
        str(tmp_path),
    )
    assert proc.returncode == 2
    assert "--batch_size: must be at least 1" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())


def test_inspect_json_figures():
    proc = run_cli(
        "inspect",
        "--model",
        "tiny.en",
        "--batch",
        "1",
        "--text-positions",
        "100",
        "--dtype",
        "float16",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["self_kv_bytes"] == 614400 and report["cross_kv_bytes"] == 9216000


def test_verify_json_is_identical(speech_dir):
    proc = run_cli("verify", str(speech_dir / "en" / "lj_LJ001-0002.flac"), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["identical"] is True
    for name in ("cached", "fallback_reuse", "alignment_reuse"):
        assert report["paths"][name]["identical"] is True
        assert report["paths"][name]["tokens"] > 0
        assert report["paths"][name]["max_abs_logit_diff"] < 1e-3


def test_api_accepts_path_and_array(tiny_model, speech_dir):
    path = speech_dir / "en" / "lj_LJ001-0002.flac"
    by_path = tiny_model.transcribe(str(path))
    by_array = tiny_model.transcribe(whisperkv.load_audio(path))
    assert by_path["text"] == by_array["text"] and "comparatively modern" in by_path["text"]
    assert by_path["language"] == "en" and by_path["segments"][0]["start"] == 0.0
    with pytest.raises(whisperkv.AudioError, match="no audio samples"):
        tiny_model.transcribe(np.zeros(0, dtype=np.float32))
