"""A corpus of bad inputs and wrong options, through the CLI and the Python API.

Every case must end in a clear error naming the file or the option, with the right exit code (2: a
usage error found before any work; 1: a file that failed while the others went on), no traceback,
and no output file for anything that failed. The CLI runs in-process (``whisperkv.cli.main``) on the
session's tiny.en model; a few real subprocess runs prove "no traceback" end to end.
"""

from __future__ import annotations

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
from whisperkv.options_check import OptionError

SHORT_CLIP = "en/common_voice_en_22058267.mp3"  # 1.85 s: "six"


def _wav(path: Path, samples: np.ndarray, rate: int = 16000) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((samples * 32767).astype("<i2").tobytes())
    return path


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, speech_dir) -> dict[str, tuple[Path, str]]:
    """name -> (path, words the error line must contain)."""
    d = tmp_path_factory.mktemp("bad")
    speech = _wav(d / "speech.wav", np.sin(np.arange(16000) / 7).astype(np.float32) * 0.5)
    header_only = d / "header.wav"
    header_only.write_bytes(speech.read_bytes()[:20])  # cut inside the 44-byte RIFF header
    (d / "empty.wav").write_bytes(b"")
    (d / "notaudio.wav").write_text("this is not audio\n")
    (d / "random.mp3").write_bytes(np.random.default_rng(0).bytes(4096))
    (d / "adir.wav").mkdir()
    (d / "truncated.flac").write_bytes((speech_dir / "en" / "jfk.flac").read_bytes()[:20000])
    _wav(d / "zero.wav", np.zeros(0, dtype=np.float32))
    return {
        "missing": (d / "missing.wav", "file not found"),
        "empty": (d / "empty.wav", "empty"),
        "not audio": (d / "notaudio.wav", "not an audio file"),
        "random bytes": (d / "random.mp3", "not an audio file"),
        "wav header cut": (header_only, "not an audio file"),
        "directory": (d / "adir.wav", "directory"),
        "truncated flac": (d / "truncated.flac", "truncated or corrupt"),
        "zero samples": (d / "zero.wav", "no audio samples"),
    }


@pytest.fixture
def run(monkeypatch, capsys, tiny_model):
    """``run(*argv) -> (exit code, stdout, stderr)``, in-process, loading the model at most once."""
    loads: list[str] = []

    def load(args):
        loads.append(args.model)
        return tiny_model

    monkeypatch.setattr(cli, "_load", load)
    monkeypatch.delenv("WHISPERKV_DEBUG", raising=False)

    def invoke(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = cli.main([str(a) for a in argv])
        except SystemExit as exit_:
            code = exit_.code
        out, err = capsys.readouterr()
        return code, out, err

    invoke.loads = loads  # type: ignore[attr-defined]
    return invoke


def _one_error_line(err: str, *words: str) -> str:
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("whisperkv: error:")]
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# ---------------------------------------------------------------------------------------------------
# bad files: one line each, exit 1, nothing written


@pytest.mark.parametrize(
    "name",
    [
        "missing",
        "empty",
        "not audio",
        "random bytes",
        "wav header cut",
        "directory",
        "truncated flac",
        "zero samples",
    ],
)
def test_cli_bad_file_is_one_line_exit_1_and_writes_nothing(run, bad_files, tmp_path, name):
    path, reason = bad_files[name]
    out = tmp_path / "out"
    code, stdout, err = run("transcribe", path, "-o", out, "-f", "all", "--verbose", "False")
    assert code == 1
    _one_error_line(err, str(path), reason)
    assert list(out.iterdir()) == []


def test_cli_batch_goes_on_past_every_bad_file(run, bad_files, speech_dir, tmp_path):
    good = speech_dir / SHORT_CLIP
    paths = [p for p, _ in bad_files.values()]
    out = tmp_path / "out"
    code, stdout, err = run(
        "transcribe", *paths[:4], good, *paths[4:], "-o", out, "-f", "json", "--beam_size", "None"
    )
    assert code == 1
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("whisperkv: error:")]
    assert len(errors) == len(paths)
    assert [p.name for p in out.iterdir()] == ["common_voice_en_22058267.json"]
    assert "six" in json.loads((out / "common_voice_en_22058267.json").read_text())["text"].lower()


def test_cli_unexpected_error_is_one_line_and_the_batch_goes_on(
    run, monkeypatch, tiny_model, speech_dir, tmp_path
):
    good = speech_dir / SHORT_CLIP
    real = whisperkv.transcribe

    def flaky(model, audio, **options):
        if str(audio).endswith("boom.wav"):
            raise RuntimeError("simulated bug")
        return real(model, audio, **options)

    monkeypatch.setattr(
        tiny_model, "transcribe", lambda audio, **options: flaky(tiny_model, audio, **options)
    )
    boom = _wav(tmp_path / "boom.wav", np.zeros(1600, dtype=np.float32))
    out = tmp_path / "out"
    code, _, err = run(boom, good, "-o", out, "-f", "txt", "--beam_size", "None")
    assert code == 1
    line = _one_error_line(err, "boom.wav", "unexpected RuntimeError: simulated bug", "--debug")
    assert line.endswith("(--debug shows where)")
    assert [p.name for p in out.iterdir()] == ["common_voice_en_22058267.txt"]

    code, _, err = run(boom, "-o", out, "-f", "txt", "--debug")
    assert code == 1 and "Traceback" in err and 'raise RuntimeError("simulated bug")' in err
    monkeypatch.setenv("WHISPERKV_DEBUG", "1")
    code, _, err = run(boom, "-o", out, "-f", "txt")
    assert code == 1 and "Traceback" in err


# ---------------------------------------------------------------------------------------------------
# bad options: one usage line naming the option, exit 2, before any work

BAD_OPTIONS = [
    (["--beam_size", "0"], "--beam_size"),
    (["--beam_size", "abc"], "--beam_size"),
    (["--best_of", "0"], "--best_of"),
    (["--best_of", "-1", "--temperature", "0.5"], "--best_of"),
    (["--temperature", "-1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--temperature", "warm"], "--temperature"),
    (["--temperature_increment_on_fallback", "0"], "--temperature_increment_on_fallback"),
    (["--patience", "0"], "--patience"),
    (["--patience", "2", "--beam_size", "None"], "--patience"),
    (["--length_penalty", "2"], "--length_penalty"),
    (["--max_line_width", "-5"], "--max_line_width"),
    (["--max_line_count", "0", "--word_timestamps", "True"], "--max_line_count"),
    (["--max_words_per_line", "0", "--word_timestamps", "True"], "--max_words_per_line"),
    (["--highlight_words", "True"], "--highlight_words"),
    (["--clip_timestamps", "abc"], "--clip_timestamps"),
    (["--clip_timestamps", "-1"], "--clip_timestamps"),
    (["--clip_timestamps", "5,2"], "--clip_timestamps"),
    (["--suppress_tokens", "abc"], "--suppress_tokens"),
    (["--suppress_tokens", "-5"], "--suppress_tokens"),
    (["--threads", "-2"], "--threads"),
    (["--device", "nonsense"], "--device"),
    (["--language", "xx"], "--language"),
    (["--task", "dance"], "--task"),
    (["--output_format", "doc"], "--output_format"),
    (["--verbose", "maybe"], "--verbose"),
    (["--no_speech_threshold", "1.5"], "--no_speech_threshold"),
    (["--compression_ratio_threshold", "-1"], "--compression_ratio_threshold"),
    (["--logprob_threshold", "inf"], "--logprob_threshold"),
    (["--hallucination_silence_threshold", "0"], "--hallucination_silence_threshold"),
    (["--batch_size", "0"], "--batch_size"),
    (["--compute_type", "int4"], "--compute_type"),
]
if not torch.cuda.is_available():
    BAD_OPTIONS.append((["--device", "cuda"], "--device"))


@pytest.mark.parametrize(
    ("argv", "option"), BAD_OPTIONS, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_cli_bad_option_is_a_usage_error_before_any_work(run, speech_dir, tmp_path, argv, option):
    out = tmp_path / "out"
    code, stdout, err = run("transcribe", speech_dir / SHORT_CLIP, "-o", out, *argv)
    assert code == 2
    line = _one_error_line(err, f"argument {option}")
    assert len(err.strip().splitlines()) == 1 and len(line) < 300  # no usage dump, no list of languages
    assert run.loads == [] and not out.exists()  # no model loaded, no directory made


def test_cli_token_id_outside_the_vocabulary_is_a_usage_error(run, speech_dir, tmp_path):
    code, _, err = run(speech_dir / SHORT_CLIP, "-o", tmp_path, "--suppress_tokens", "99999")
    assert code == 2
    _one_error_line(err, "argument --suppress_tokens", "99999", "51864")
    assert list(tmp_path.iterdir()) == []


def test_cli_output_dir_that_is_a_file_is_said_in_words(run, speech_dir, tmp_path):
    a_file = tmp_path / "out"
    a_file.write_text("keep me")
    code, _, err = run(speech_dir / SHORT_CLIP, "-o", a_file)
    assert code == 2
    _one_error_line(err, "--output_dir", "exists and is not a directory")
    assert "Errno" not in err and a_file.read_text() == "keep me" and run.loads == []


def test_cli_two_inputs_with_one_base_name_are_refused_before_any_work(run, speech_dir, tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "clip.mp3").write_bytes((speech_dir / SHORT_CLIP).read_bytes())
    out = tmp_path / "out"
    code, _, err = run(tmp_path / "a" / "clip.mp3", tmp_path / "b" / "clip.mp3", "-o", out, "-f", "txt")
    assert code == 2
    _one_error_line(err, "a/clip.mp3", "b/clip.mp3", "clip.txt")
    assert run.loads == [] and not out.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["verify", "x.wav", "--beam_size", "0"],
        ["verify", "x.wav", "--language", "xx"],
        ["verify", "x.wav", "--threads", "-1"],
        ["inspect", "--batch", "0"],
        ["inspect", "--text-positions", "-1"],
        ["inspect", "--dtype", "float8"],
        ["convert", "tiny.en", "out.pt", "--format", "onnx"],
    ],
    ids=" ".join,
)
def test_other_commands_refuse_bad_options(run, argv):
    code, _, err = run(*argv)
    assert code == 2
    _one_error_line(err, "argument --")
    assert run.loads == []


def test_inspect_text_positions_beyond_the_context_is_one_line(run):
    code, _, err = run("inspect", "--text-positions", "9999")
    assert code == 2
    _one_error_line(err, "text positions", "448")


# ---------------------------------------------------------------------------------------------------
# the Python API: the project's error type (also a ValueError) naming the option, before any work

BAD_API_OPTIONS = [
    ({"beam_size": 0}, "beam_size"),
    ({"best_of": -1, "temperature": 0.5}, "best_of"),
    ({"temperature": -1.0}, "temperature"),
    ({"temperature": ()}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": "0.5"}, "temperature"),
    ({"patience": -1.0, "beam_size": 5}, "patience"),
    ({"length_penalty": 2.0}, "length_penalty"),
    ({"suppress_tokens": "abc"}, "suppress_tokens"),
    ({"suppress_tokens": [99999]}, "suppress_tokens"),
    ({"clip_timestamps": "abc"}, "clip_timestamps"),
    ({"clip_timestamps": [5.0, 2.0]}, "clip_timestamps"),
    ({"no_speech_threshold": 2.0}, "no_speech_threshold"),
    ({"compression_ratio_threshold": float("inf")}, "compression_ratio_threshold"),
    ({"word_timestamps": "False"}, "word_timestamps"),
    ({"verbose": "yes"}, "verbose"),
    ({"language": "xx"}, "language"),
    ({"task": "dance"}, "task"),
    ({"beamsize": 5}, "beamsize"),
    ({"sample_len": 0}, "sample_len"),
    ({"initial_prompt": 5}, "initial_prompt"),
    ({"hallucination_silence_threshold": -1.0}, "hallucination_silence_threshold"),
]


@pytest.mark.parametrize(
    ("options", "name"), BAD_API_OPTIONS, ids=lambda v: str(v) if isinstance(v, dict) else ""
)
def test_api_bad_option_is_refused_naming_it(tiny_model, tmp_path, options, name):
    # a missing file: had the audio been opened first, this would be an AudioError, not an OptionError
    with pytest.raises(OptionError, match=name) as caught:
        tiny_model.transcribe(str(tmp_path / "missing.wav"), **options)
    assert isinstance(caught.value, whisperkv.WhisperKVError) and isinstance(caught.value, ValueError)
    assert caught.value.option == name


@pytest.mark.parametrize("name", ["missing", "empty", "not audio", "directory", "zero samples"])
def test_api_bad_file_raises_audio_error(tiny_model, bad_files, name):
    path, reason = bad_files[name]
    with pytest.raises(whisperkv.AudioError, match=reason):
        tiny_model.transcribe(str(path))


# ---------------------------------------------------------------------------------------------------
# end to end: real processes, real tracebacks (or none)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "whisperkv", *map(str, args)], capture_output=True, text=True, timeout=300
    )


def test_subprocess_bad_option_and_bad_file_print_no_traceback(bad_files, tmp_path):
    proc = _cli("transcribe", bad_files["empty"][0], "--beam_size", "0", "-o", tmp_path / "o")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("whisperkv: error: argument --beam_size: must be at least 1, got 0")
    assert not (tmp_path / "o").exists()

    proc = _cli(*(p for p, _ in bad_files.values()), "-o", tmp_path / "o", "-f", "txt")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == len(bad_files)
    assert list((tmp_path / "o").iterdir()) == []


def test_api_accepts_every_valid_spelling(tiny_model):
    """The checks refuse only what is wrong: the reference's defaults and its other spellings pass."""
    from whisperkv.options_check import check_transcribe_options

    check_transcribe_options(
        tiny_model,
        verbose=None,
        temperature=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        compression_ratio_threshold=2.4,
        logprob_threshold=-1.0,
        no_speech_threshold=0.6,
        condition_on_previous_text=True,
        initial_prompt=None,
        word_timestamps=np.bool_(False),
        clip_timestamps="0,5.5,7",
        hallucination_silence_threshold=None,
        task="transcribe",
        language="German",
        beam_size=np.int64(5),
        best_of=5,
        patience=1.0,
        length_penalty=0.5,
        suppress_tokens="-1,50256",
        fp16=False,
        prompt=[50257, 11],
    )
    check_transcribe_options(None, temperature=1.5, suppress_tokens=[], clip_timestamps=[0.0, 1.0])
