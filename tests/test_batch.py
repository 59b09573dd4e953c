"""`whisperkv batch`: one record per file, outputs equal to `whisperkv transcribe`, resume, verify, Ray.

The jobs here decode greedily (`--beam_size none --best_of none`) to keep the default run short; the
options travel unchanged to `transcribe()`, so the comparison with `whisperkv transcribe` run with the
same options is exact either way.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.conftest import SPEECH_DIR, require_oracle
from whisperkv.batch.inputs import BatchItem, InputError, expand_inputs, output_stems
from whisperkv.cli import main

CLIPS = ["en/jfk.flac", "en/ls_1089-134691-0000.flac", "en/ls_1089-134686-0001.flac", "en/mfa_her.flac"]
GREEDY = ["--beam_size", "none", "--best_of", "none"]
FORMATS = ("txt", "vtt", "srt", "tsv")


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory) -> Path:
    """Four shared clips (two with the same name in sub-folders) and two bad files."""
    if not SPEECH_DIR.is_dir():
        pytest.skip("speech set not found")
    root = tmp_path_factory.mktemp("inputs")
    for rel in CLIPS:
        shutil.copy(SPEECH_DIR / rel, root / Path(rel).name)
    (root / "again").mkdir()
    shutil.copy(SPEECH_DIR / CLIPS[0], root / "again" / "jfk.flac")
    (root / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really audio")
    (root / "empty.mp3").write_bytes(b"")
    (root / "notes.md").write_text("not an audio extension: ignored")
    return root


def read_records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def first_run(job_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("batch")
    code = main(["batch", str(job_dir), "-o", str(out), "--workers", "2", *GREEDY])
    return code, out


def test_one_record_per_file_errors_recorded(first_run, job_dir):
    code, out = first_run
    assert code == 1  # two files failed
    records = read_records(out)
    assert len(records) == 7
    by_name = {Path(r["path"]).relative_to(job_dir).as_posix(): r for r in records}
    assert set(by_name) == {Path(c).name for c in CLIPS} | {"again/jfk.flac", "broken.wav", "empty.mp3"}
    for bad in ("broken.wav", "empty.mp3"):
        assert by_name[bad]["error"] and bad in by_name[bad]["error"]
        assert by_name[bad]["outputs"] == []
    for name in [*map(lambda c: Path(c).name, CLIPS), "again/jfk.flac"]:
        r = by_name[name]
        assert r["error"] is None and r["text"].strip()
        assert len(r["audio_sha256"]) == 64 and r["duration"] > 0 and r["weights_digest"]
        assert r["options"]["beam_size"] is None and r["whisperkv_version"]
    assert by_name["jfk.flac"]["audio_sha256"] == by_name["again/jfk.flac"]["audio_sha256"]
    # two inputs named jfk.flac keep separate outputs (the first in sorted order keeps the plain name)
    stems = {Path(p).stem for name in ("jfk.flac", "again/jfk.flac") for p in by_name[name]["outputs"]}
    assert stems == {"jfk", "jfk-2"} and len(by_name["jfk.flac"]["outputs"]) == 5


def test_outputs_identical_to_transcribe(first_run, job_dir, tmp_path):
    _, out = first_run
    files = [str(job_dir / Path(c).name) for c in CLIPS[1:]]  # jfk.flac's outputs are named jfk-2
    assert main(["transcribe", *files, "-o", str(tmp_path), "--verbose", "False", *GREEDY]) == 0
    for path in files:
        stem = Path(path).stem
        for fmt in FORMATS:
            assert (out / f"{stem}.{fmt}").read_text() == (tmp_path / f"{stem}.{fmt}").read_text(), (
                stem,
                fmt,
            )
        ours, theirs = (
            json.loads((out / f"{stem}.json").read_text()),
            json.loads((tmp_path / f"{stem}.json").read_text()),
        )
        assert ours["segments"] == theirs["segments"] and ours["text"] == theirs["text"]


def test_rerun_skips_done_files_and_changed_option_redoes_them(first_run, job_dir, capsys):
    _, out = first_run
    before = read_records(out)
    assert main(["batch", str(job_dir), "-o", str(out), *GREEDY]) == 1  # the two bad files fail again
    after = read_records(out)
    redone = [Path(r["path"]).name for r in after[len(before) :]]
    assert sorted(redone) == ["broken.wav", "empty.mp3"]  # only the failed ones were tried again
    assert "5 skipped" in capsys.readouterr().err
    # a changed option changes the options digest: every file is transcribed again
    assert (
        main(["batch", str(job_dir), "-o", str(out), *GREEDY, "--condition_on_previous_text", "False"]) == 1
    )
    again = read_records(out)[len(after) :]
    assert len(again) == 7
    assert len({r["options_digest"] for r in again if not r["error"]}) == 1
    assert again[0]["options_digest"] != before[0]["options_digest"]


def test_verify_finds_a_changed_transcript(job_dir, tmp_path, capsys):
    clip = job_dir / "ls_1089-134691-0000.flac"
    assert main(["batch", str(clip), "-o", str(tmp_path), *GREEDY, "--verify", "1"]) == 0
    assert "1 of 1 re-transcribed files identical" in capsys.readouterr().err
    record = read_records(tmp_path)[0]
    record["text"] = record["text"] + " (edited)"
    with open(tmp_path / "results.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    assert main(["batch", str(clip), "-o", str(tmp_path), *GREEDY, "--verify", "1"]) == 1
    err = capsys.readouterr().err
    assert "0 of 1 re-transcribed files identical" in err and "text differs" in err


def test_manifests(tmp_path):
    (tmp_path / "a.wav").write_bytes(b"")
    (tmp_path / "m.tsv").write_text("path\tlanguage\na.wav\tde\n")
    (tmp_path / "m.jsonl").write_text(json.dumps({"file": str(tmp_path / "b.flac")}) + "\n")
    (tmp_path / "m.txt").write_text("# comment\na.wav\n")
    items = expand_inputs([str(tmp_path / "m.tsv"), str(tmp_path / "m.jsonl"), str(tmp_path / "m.txt")])
    assert items == [BatchItem(str(tmp_path / "a.wav"), "de"), BatchItem(str(tmp_path / "b.flac"))]
    (tmp_path / "bad.csv").write_text("name,lang\nx,en\n")
    with pytest.raises(InputError, match="no path column"):
        expand_inputs([str(tmp_path / "bad.csv")])
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(InputError, match="bad.jsonl:1: not JSON"):
        expand_inputs([str(tmp_path / "bad.jsonl")])
    with pytest.raises(InputError, match="no such file"):
        expand_inputs([str(tmp_path / "missing_folder")])
    assert output_stems([BatchItem("x/a.wav"), BatchItem("y/a.flac"), BatchItem("a-2.wav")]) == {
        "x/a.wav": "a",
        "y/a.flac": "a-2",
        "a-2.wav": "a-2-2",
    }


def test_usage_errors(tmp_path, capsys):
    assert main(["batch", str(tmp_path / "nowhere"), "-o", str(tmp_path / "o")]) == 2
    assert "no such file, folder or manifest" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["batch", str(tmp_path), "-o", str(tmp_path / "file")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # refused while parsing, as `whisperkv transcribe` refuses it
        main(["batch", str(tmp_path), "-o", str(tmp_path / "o"), "--beam_size", "0"])
    assert exit_.value.code == 2
    assert "argument --beam_size" in capsys.readouterr().err
    assert main(["batch", str(tmp_path), "-o", str(tmp_path / "o"), "--suppress_tokens", "abc"]) == 2
    assert "argument --suppress_tokens" in capsys.readouterr().err


def _actor_pids() -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"ray::TranscribeActor" in cmdline:
                pids.append(int(entry))
    return pids


def test_ray_engine_survives_a_killed_worker(first_run, job_dir, tmp_path):
    """A local Ray (2 CPUs, 2 actors); one actor is killed after the first file: all files still done,
    every transcript identical to the local engine's."""
    require_oracle("ray")
    from whisperkv.batch.ray_engine import run_ray
    from whisperkv.batch.work import JobSpec

    _, local_out = first_run
    local = {r["path"]: r for r in read_records(local_out)[:7]}
    spec = JobSpec("tiny.en", "default", local[next(iter(local))]["options"], str(tmp_path), "txt", threads=1)
    items = [i for i in expand_inputs([str(job_dir)]) if not i.path.endswith((".wav", ".mp3"))]
    stems = output_stems(items)
    records, killed = [], []

    def on_record(record: dict) -> None:
        records.append(record)
        if not killed:
            pids = _actor_pids()
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])

    run_ray(spec, [(i, stems[i.path]) for i in items], 2, on_record)
    assert killed, "no Ray actor process was found to kill"
    assert sorted(r["path"] for r in records) == sorted(i.path for i in items)
    for r in records:
        assert r["error"] is None
        assert r["text"] == local[r["path"]]["text"] and r["segments"] == local[r["path"]]["segments"]
