"""The command line's help and argument checks: what a newcomer reads and mistypes, refused before any work.

No test here loads a model: every check named here must happen before one would load (the loader is
replaced by one that fails the test).
"""

from __future__ import annotations

import argparse
import io

import pytest

from whisperkv import cli
from whisperkv.batch.work import JobSpec


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: the checks under test must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the arguments were checked")

    monkeypatch.setattr(cli, "_load", refuse)
    monkeypatch.setattr(JobSpec, "load_model", refuse)
    monkeypatch.setattr("whisperkv.load.load_model", refuse)


def _main(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_top_level_help_lists_every_command_on_one_line(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out
    lines = out.splitlines()
    assert len(cli.COMMANDS) == 10
    for name, summary in cli.COMMANDS.items():
        assert any(line.split() == [name, *summary.split()] for line in lines), (name, out)
    assert max(map(len, lines)) <= 80
    assert set(_subparsers(cli.build_parser())) == set(cli.COMMANDS)


def test_every_command_has_a_description_and_no_doubled_or_empty_default(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # one line per option: a doubled default would share it
    for name, parser in _subparsers(cli.build_parser()).items():
        assert parser.description, name
        text = parser.format_help()
        assert parser.description in " ".join(text.split()), name
        assert "(default: None)" not in text, name
        for line in text.splitlines():
            assert line.count("(default:") <= 1, (name, line)
    convert = _subparsers(cli.build_parser())["convert"].format_help()
    assert "format to write" in convert and "format to write (default" not in convert  # required


def test_misspelt_command_is_refused_with_a_suggestion(no_model, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = _main(capsys, "transcrib", "jfk.flac")
    assert code == 2
    assert "unknown command 'transcrib': did you mean 'transcribe'?" in err
    code, err = _main(capsys, "bacth", "in", "-o", "out")
    assert code == 2 and "did you mean 'batch'?" in err
    code, err = _main(capsys, "frobnicate")
    assert code == 2 and "unknown command 'frobnicate'" in err and "encoder-worker" in err


def test_an_existing_file_named_like_a_command_is_transcribed(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "transcrib").write_bytes(b"not audio")
    loaded = []

    def load(args):
        loaded.append(args.audio)
        raise cli.WhisperKVError("stop here")

    monkeypatch.setattr(cli, "_load", load)
    code, err = _main(capsys, "transcrib")
    assert loaded == [["transcrib"]] and code == 2 and "stop here" in err


@pytest.mark.parametrize("spelling", ["yes", "true", "1", "TRUE", "no", "0", " True"])
def test_booleans_take_only_the_reference_spellings(no_model, capsys, spelling):
    code, err = _main(capsys, "transcribe", "x.flac", "--word_timestamps", spelling)
    assert code == 2
    assert f"argument --word_timestamps: expected True or False, got {spelling!r}" in err
    args = cli.build_parser().parse_args(["transcribe", "x.flac", "--word_timestamps", "True"])
    assert args.word_timestamps is True
    args = cli.build_parser().parse_args(["transcribe", "x.flac", "--batched", "False"])
    assert args.batched is False


def test_no_option_of_any_command_takes_nan_or_infinity():
    checked = 0
    for name, parser in _subparsers(cli.build_parser()).items():
        for action in parser._actions:
            if action.type is None or not callable(action.type):
                continue
            for text in ("nan", "inf", "-inf", "NaN", "Infinity"):
                try:
                    value = action.type(text)
                except (argparse.ArgumentTypeError, ValueError, TypeError):
                    continue
                assert not isinstance(value, float), (name, action.dest, text, value)
            checked += 1
    assert checked > 30  # every typed option of every command was tried


@pytest.mark.parametrize(
    "argv, option",
    [
        (["stream", "x.flac", "--chunk", "nan"], "--chunk"),
        (["stream", "x.flac", "--chunk", "0"], "--chunk"),
        (["stream", "x.flac", "--simulate_compute", "inf"], "--simulate_compute"),
        (["transcribe", "x.flac", "--temperature", "nan"], "--temperature"),
        (["transcribe", "x.flac", "--patience", "inf"], "--patience"),
        (["serve", "--max_upload_mb", "inf"], "--max_upload_mb"),
        (["batch", "x.flac", "-o", "out", "--no_speech_threshold", "nan"], "--no_speech_threshold"),
    ],
)
def test_non_finite_numbers_are_refused_by_name(no_model, capsys, argv, option):
    code, err = _main(capsys, *argv)
    assert code == 2 and f"argument {option}:" in err, err


class _Terminal(io.BytesIO):
    def isatty(self) -> bool:
        return True

    @property
    def buffer(self):
        return self


def test_stream_with_a_terminal_on_stdin_says_what_it_expects(no_model, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", _Terminal())
    for argv in (["stream"], ["stream", "-"]):
        code, err = _main(capsys, *argv)
        assert code == 2
        assert "no input: give an audio file, or pipe s16le 16 kHz mono PCM" in err
        assert "standard input is a terminal" in err


def test_missing_inputs_are_reported_before_the_model_loads(no_model, capsys, tmp_path):
    missing = tmp_path / "missing.flac"
    for extra in (["transcribe", "-o", tmp_path / "out"], ["verify", "--json"]):
        code, err = _main(capsys, extra[0], missing, tmp_path, *extra[1:])
        assert code == 1
        assert f"whisperkv: error: {missing}: file not found" in err
        assert f"whisperkv: error: {tmp_path}: is a directory, not a file" in err
    code, err = _main(capsys, missing)  # no sub-command: transcribe
    assert code == 1 and "file not found" in err
    code, err = _main(capsys, "explain", missing)
    assert code == 2 and f"{missing}: file not found" in err
    code, err = _main(capsys, "batch", missing, "-o", tmp_path / "out")  # (among others: a result line)
    assert code == 1 and f"whisperkv batch: error: {missing}: file not found" in err
    code, err = _main(capsys, "batch", tmp_path / "no_folder", "-o", tmp_path / "out")
    assert code == 2 and "no_folder: no such file, folder or manifest" in err
    code, err = _main(capsys, "stream", missing)
    assert code == 2 and f"{missing}: file not found" in err


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """``whisperkv models | head -c 1``: the closed pipe is no error line and no traceback (exit 141)."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "whisperkv", "models"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.stdout.close()  # nobody reads: the first write finds the pipe closed
        stderr = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    assert code == 141, stderr
    assert stderr == ""
