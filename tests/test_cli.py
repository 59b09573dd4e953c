"""The command line: outputs per input, and one clear error line (never a traceback) per bad input."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

import whisperkv
from whisperkv import cli
from whisperkv.cli_options import temperature_schedule

SHORT_CLIP = "en/common_voice_en_22058267.mp3"  # 1.85 s: "six"


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
    assert f"whisperkv: warning: {bad_inputs / 'silence.wav'}: no speech found" in proc.stderr
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
    assert silence["warnings"] == ["no speech found: the transcript is empty"]
    jfk = json.loads((out / "jfk.json").read_text())
    assert "ask not what your country can do for you" in jfk["text"] and "warnings" not in jfk
    assert proc.stdout == ""  # --verbose False: nothing but warnings and errors, like the reference
    assert jfk["cache"]["cross_kv_bytes"] == 2 * 4 * 1500 * 384 * 4


def test_output_format_all_writes_every_writer(run, tmp_path, speech_dir):
    clip = speech_dir / "en" / "lj_LJ001-0008.flac"
    code, out, err = run(
        "transcribe", clip, "--output_dir", tmp_path, "--beam_size", "None", "--best_of", "None"
    )
    assert code == 0, err
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".srt", ".tsv", ".txt", ".vtt"]
    assert "surpassed" in (tmp_path / "lj_LJ001-0008.txt").read_text()
    assert "-->" in out  # verbose prints timed segments


def test_bad_model_is_one_line_and_exit_2(capsys, tmp_path, speech_dir):
    code = cli.main(["transcribe", str(speech_dir / SHORT_CLIP), "--model", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip().startswith("whisperkv: error: unknown model")
    assert len(err.strip().splitlines()) == 1


def test_inspect_json_figures(run):
    argv = ["inspect", "--model", "tiny.en", "--batch", "1", "--text-positions", "100", "--dtype", "float16"]
    code, out, err = run(*argv, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["self_kv_bytes"] == 614400 and report["cross_kv_bytes"] == 9216000


def test_api_accepts_path_and_array(tiny_model, speech_dir):
    path = speech_dir / "en" / "lj_LJ001-0002.flac"
    by_path = tiny_model.transcribe(str(path))
    by_array = tiny_model.transcribe(whisperkv.load_audio(path))
    assert by_path["text"] == by_array["text"] and "comparatively modern" in by_path["text"]
    assert by_path["language"] == "en" and by_path["segments"][0]["start"] == 0.0
    with pytest.raises(whisperkv.AudioError, match="no audio samples"):
        tiny_model.transcribe(np.zeros(0, dtype=np.float32))


# ---------------------------------------------------------------------------------------------------
# in-process runs of ``whisperkv.cli.main`` on the session's model (no subprocess, no second load)


@pytest.fixture
def run(monkeypatch, capsys, tiny_model):
    """``run(*argv) -> (exit code, stdout, stderr)`` with the model loaded once for the session."""
    monkeypatch.setattr(cli, "_load", lambda args: tiny_model)

    def invoke(*argv) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = cli.main([str(a) for a in argv])
        except SystemExit as exit_:
            code = exit_.code
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def test_help_gives_every_option_a_text_and_its_default(capsys):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        for action in command._actions:
            assert action.help and action.help.strip(), f"{name} {action.option_strings or action.dest}"
    with pytest.raises(SystemExit):
        cli.main(["transcribe", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in (
        "--beam_size BEAM_SIZE",
        "(default: 5)",
        "(default: 2.4)",
        "(default: -1)",
        "(default: all)",
    ):
        assert shown in text, shown
    assert "Codes: en zh de" in text  # --language lists the codes in the help, not in an error


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"whisperkv {whisperkv.__version__}"


def test_warning_is_one_line_and_verbose_false_prints_nothing(run, speech_dir, tmp_path):
    clip = speech_dir / SHORT_CLIP
    code, out, err = run(clip, "--model_dir", "x", "--verbose", "False", "-o", tmp_path, "-f", "json")
    assert code == 0 and out == ""
    assert err == "whisperkv: warning: --model_dir is ignored: whisperkv loads local weights only\n"
    segments = json.loads((tmp_path / "common_voice_en_22058267.json").read_text())["segments"]
    code, out, err = run(clip, "-o", tmp_path, "-f", "json")  # --verbose True: one line per segment
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) == len(segments) >= 1
    assert lines[0].startswith("[00:00.000 --> ") and lines[0].endswith(segments[0]["text"])


def test_silence_and_a_short_clip_are_empty_and_say_so(run, tmp_path):
    silence = tmp_path / "silence.wav"
    _wav(silence, np.zeros(16000 * 3, dtype=np.float32))
    short = tmp_path / "short.wav"
    _wav(short, 0.3 * np.sin(np.arange(800) / 5))  # 0.05 s
    out = tmp_path / "out"
    code, stdout, err = run(silence, short, "-o", out, "-f", "all", "--verbose", "False")
    assert code == 0 and stdout == ""
    assert err.splitlines() == [
        f"whisperkv: warning: {silence}: no speech found: the transcript is empty",
        f"whisperkv: warning: {short}: no speech found: the transcript is empty",
    ]
    for name in ("silence", "short"):
        result = json.loads((out / f"{name}.json").read_text())
        assert result["text"] == "" and result["warnings"] == ["no speech found: the transcript is empty"]
        assert (out / f"{name}.txt").read_text() == ""


def test_temperature_above_one_is_tried_alone(run, speech_dir, tmp_path):
    assert temperature_schedule(1.5, 0.2) == (1.5,)  # was (): an empty schedule, then an AssertionError
    assert temperature_schedule(0.0, 0.2) == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert temperature_schedule(0.5, None) == (0.5,)
    argv = ["--temperature", "1.5", "--best_of", "1", "-o", tmp_path, "-f", "json"]  # one sample: cheap
    code, _, err = run(speech_dir / SHORT_CLIP, *argv)
    assert code == 0, err
    result = json.loads((tmp_path / "common_voice_en_22058267.json").read_text())
    assert {s["temperature"] for s in result["segments"]} <= {1.5}


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only torch")
def test_device_cuda_on_cpu_only_torch_is_a_usage_error(run, speech_dir, tmp_path):
    code, _, err = run(speech_dir / SHORT_CLIP, "--device", "cuda", "-o", tmp_path / "o")
    assert code == 2 and "Traceback" not in err
    assert err.startswith("whisperkv: error: argument --device: CUDA is not available")


def test_inspect_defaults_to_the_dtype_a_cpu_run_uses(run):
    code, out, _ = run("inspect", "--text-positions", "10", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["dtype"] == "float32"
    assert report["cross_kv_bytes"] == 2 * 4 * 1500 * 384 * 4  # 4 bytes an element, as the CPU runs


def test_verify_detects_the_language_on_a_multilingual_model(
    monkeypatch, capsys, base_model, speech_dir, tmp_path
):
    monkeypatch.setattr(cli, "_load", lambda args: base_model)
    clip = tmp_path / "de_1s.wav"  # the first second of a German clip: few tokens, a cheap twin decode
    _wav(clip, whisperkv.load_audio(speech_dir / "xx" / "pv_test_de.wav")[:16000])
    code = cli.main(["verify", str(clip), "--model", "base", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["identical"] is True
    assert report["paths"]["language_reuse"]["identical"] is True  # crashed: a 2-D log-Mel to the encoder
    for name in ("cached", "fallback_reuse", "alignment_reuse"):
        assert report["paths"][name]["identical"] is True
        assert report["paths"][name]["tokens"] > 0
        assert report["paths"][name]["max_abs_logit_diff"] < 1e-3


def test_setup_installs_the_oracle_last_and_declares_an_spdx_license():
    """A clean setup prints no ERROR: openai-whisper (without triton) goes in last, with --no-deps.

    pip re-checks an installed package's requirements whenever a later install touches one of them,
    and then prints "ERROR: pip's dependency resolver ... triton"; setuptools warns about a license
    table. (Checked by running both orders in fresh virtual environments; see the report.)
    """
    root = Path(__file__).resolve().parents[1]
    installs = [
        line.split()
        for line in (root / "scripts" / "setup.sh").read_text().splitlines()
        if line.strip().startswith("pip install")
    ]
    assert installs[1][-1] == "torch==2.13.0"
    oracle = [i for i, words in enumerate(installs) if any(w.startswith("openai-whisper") for w in words)]
    assert oracle == [len(installs) - 1] and "--no-deps" in installs[-1]
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["license"] == "MIT"
