"""`whisperkv batch` after a crash: no worker outlives a killed parent, no output exists without its
`results.jsonl` line, and a ledger whose last line was cut is repaired before anything is appended."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SPEECH_DIR
from whisperkv.batch.ledger import repair
from whisperkv.batch.work import JobSpec
from whisperkv.cli import main

SHORT = [
    "en/lj_LJ002-0020.wav",
    "en/lj_LJ002-0035.wav",
    "en/lj_LJ001-0008.flac",
    "en/lj_LJ001-0002.flac",
    "en/ls_1089-134691-0000.flac",
    "en/ls_367-130732-0000.flac",
]
GREEDY = ["--beam_size", "None", "--best_of", "None", "-f", "txt"]


@pytest.fixture
def clips(tmp_path) -> Path:
    if not SPEECH_DIR.is_dir():
        pytest.skip("speech set not found")
    folder = tmp_path / "clips"
    folder.mkdir()
    for rel in SHORT:
        shutil.copy(SPEECH_DIR / rel, folder / Path(rel).name)
    return folder


def _lines(out: Path) -> list[str]:
    return (out / "results.jsonl").read_text(encoding="utf-8").splitlines()


# ---------------------------------------------------------------------------------------------------
# a ledger cut mid-line


@pytest.mark.parametrize(
    "before, after, dropped",
    [
        (b'{"a": 1}\n{"b": 2}\n', b'{"a": 1}\n{"b": 2}\n', False),
        (b'{"a": 1}\n{"b": ', b'{"a": 1}\n', True),
        (b'{"a": 1', b"", True),
        (b"", b"", False),
        (b"x" * 200_000, b"", True),  # longer than one backwards read
        (b'{"a": 1}\n' + b"y" * 100_000, b'{"a": 1}\n', True),
    ],
)
def test_repair_drops_only_a_cut_last_line(tmp_path, before, after, dropped):
    path = tmp_path / "results.jsonl"
    path.write_bytes(before)
    assert repair(str(path)) is dropped
    assert path.read_bytes() == after


def test_cut_ledger_is_repaired_and_its_file_redone_exactly_once(
    clips, tmp_path, tiny_model, monkeypatch, capsys
):
    monkeypatch.setattr(JobSpec, "load_model", lambda self: tiny_model)
    for extra in SHORT[2:]:
        (clips / Path(extra).name).unlink()  # two files: the case that lost a record
    out = tmp_path / "out"
    assert main(["batch", str(clips), "-o", str(out), *GREEDY]) == 0
    first = _lines(out)
    assert len(first) == 2
    ledger = out / "results.jsonl"
    data = ledger.read_bytes()
    cut_file = json.loads(first[-1])["path"]
    ledger.write_bytes(data[: len(data) - len(first[-1]) // 2])  # the last write cut by a crash
    capsys.readouterr()
    assert main(["batch", str(clips), "-o", str(out), *GREEDY]) == 0
    assert "1 ok, 0 failed, 1 skipped of 2 files" in capsys.readouterr().err
    second = _lines(out)
    records = [json.loads(line) for line in second]  # every line readable: nothing glued
    assert len(records) == 2 and second[0] == first[0]
    assert records[1]["path"] == cut_file and records[1]["text"] == json.loads(first[1])["text"]
    assert main(["batch", str(clips), "-o", str(out), *GREEDY]) == 0
    assert "0 ok, 0 failed, 2 skipped of 2 files" in capsys.readouterr().err
    assert _lines(out) == second  # nothing redone, nothing appended


# ---------------------------------------------------------------------------------------------------
# the parent killed with SIGKILL


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (a dead child PID 1 has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_the_parent_leaves_no_worker_and_no_output_without_its_line(clips, tmp_path):
    out = tmp_path / "out"
    parent = subprocess.Popen(
        [sys.executable, "-m", "whisperkv", "batch", str(clips), "-o", str(out), "--workers", "2", *GREEDY],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # the test kills the parent only, as `kill -9 PID` would
    )
    ledger = out / "results.jsonl"
    children: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and parent.poll() is None:
            children.update(_children(parent.pid))
            if ledger.exists() and ledger.read_text().count("\n") >= 1:
                break
            time.sleep(0.05)
        assert parent.poll() is None, parent.stderr.read().decode()
        children.update(_children(parent.pid))
        assert len(children) >= 3  # two workers and the resource tracker
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_running(pid) for pid in children):
            time.sleep(0.05)
        survivors = [pid for pid in children if _running(pid)]
        assert survivors == [], f"still running after the parent's SIGKILL: {survivors}"
    finally:
        for pid in children | {parent.pid}:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        parent.stderr.close()
    recorded = {path for line in _lines(out) for path in json.loads(line)["outputs"]}
    outputs = {str(p) for p in out.iterdir() if p.name != "results.jsonl" and not p.name.startswith(".")}
    assert outputs <= recorded, outputs - recorded  # (staged, hidden outputs may remain: redone next run)
    assert len(_lines(out)) < len(SHORT)  # killed before the end: the case under test
