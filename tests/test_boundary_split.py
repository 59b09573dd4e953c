"""Encoder in another process, decoder here: transcripts identical to the in-process path (issue 11).

The cross_kv worker is a real second process (``whisperkv encoder-worker``), the features worker a
thread; both listen on 127.0.0.1 and are stopped by their fixtures. The slow sweep covers every English
clip and both long-form files, greedy and beam 5, in both carry modes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import SPEECH_DIR, clip_path, english_clips
from whisperkv.boundary.client import RemoteEncoder
from whisperkv.boundary.worker import background_worker, create_app

ROOT = Path(__file__).resolve().parents[1]
SECRET = os.urandom(32)  # the shared secret is 32 random bytes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("boundary") / "secret"
    path.write_bytes(SECRET)
    path.chmod(0o600)  # the worker refuses a secret file others can read
    return path


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "NO_PROXY": "127.0.0.1"}


@pytest.fixture(scope="module")
def process_worker(secret_file) -> Iterator[str]:
    """``whisperkv encoder-worker --carry cross_kv`` in its own process, until the module is done."""
    port = _free_port()
    cmd = [sys.executable, "-m", "whisperkv", "encoder-worker", "--port", str(port)]
    cmd += ["--secret_file", str(secret_file), "--carry", "cross_kv", "--threads", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"encoder worker exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(url + "/healthz", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("encoder worker did not start in 180 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def thread_worker(tiny_model) -> Iterator[str]:
    with background_worker(create_app(tiny_model, SECRET, "features")) as url:
        yield url


def _same(remote: dict, local: dict) -> None:
    assert remote["text"] == local["text"]
    keys = ("start", "end", "text", "tokens", "temperature", "avg_logprob", "no_speech_prob")
    assert [{k: s[k] for k in keys} for s in remote["segments"]] == [
        {k: s[k] for k in keys} for s in local["segments"]
    ]
    assert [s.get("words") for s in remote["segments"]] == [s.get("words") for s in local["segments"]]


def test_features_carry_greedy_is_identical(tiny_model, thread_worker, speech_dir):
    path = str(speech_dir / "en" / "jfk.flac")
    local = tiny_model.transcribe(path, verbose=None, report_costs=True)
    with RemoteEncoder(thread_worker, SECRET, carry="features") as encoder:
        remote = tiny_model.transcribe(path, encoder=encoder, verbose=None)
    _same(remote, local)
    (costs,) = remote["costs"]
    assert costs["carry"] == "features" and costs["projection_side"] == "decoder"
    assert costs["bytes_received"] - 1500 * 384 * 4 < 1024  # the encoder output, a label and a tag
    assert costs["tokens"] == sum(len(s["tokens"]) for s in remote["segments"]) and costs["decode_ms"] > 0
    assert local["costs"][0]["carry"] == "local" and local["costs"][0]["bytes_received"] == 0


BEAM_WORDS = {"beam_size": 5, "word_timestamps": True, "verbose": None}


@pytest.fixture(scope="module")
def local_beam5_words(tiny_model, speech_dir) -> dict:
    return tiny_model.transcribe(str(speech_dir / "en" / "jfk.flac"), **BEAM_WORDS)


def test_cross_kv_carry_from_another_process_beam5_with_words(
    tiny_model, process_worker, speech_dir, local_beam5_words
):
    path = str(speech_dir / "en" / "jfk.flac")
    options, local = BEAM_WORDS, local_beam5_words
    with RemoteEncoder(process_worker, SECRET, carry="cross_kv") as encoder:
        remote = tiny_model.transcribe(path, encoder=encoder, **options)
    _same(remote, local)
    (costs,) = remote["costs"]
    assert costs["projection_side"] == "worker" and costs["bytes_received"] - 8 * 1500 * 384 * 4 < 4096


def test_cli_remote_transcribe_and_one_line_refusal(
    tiny_model, process_worker, secret_file, tmp_path, speech_dir, local_beam5_words, monkeypatch, capsys
):
    """``whisperkv transcribe --encoder_url``: through the worker process, then a one-line refusal with
    the wrong secret (exit 1, no output file). The CLI runs in this process on the already loaded model."""
    from whisperkv import cli

    monkeypatch.setattr(cli, "_load", lambda args: tiny_model)
    jfk = speech_dir / "en" / "jfk.flac"
    wrong = tmp_path / "wrong-secret"
    wrong.write_bytes(os.urandom(32))
    wrong.chmod(0o600)
    out_ok, out_bad = tmp_path / "ok", tmp_path / "bad"
    base = ["transcribe", str(jfk), "--encoder_url", process_worker, "--carry", "cross_kv"]
    base += ["--verbose", "False", "-f", "txt", "--word_timestamps", "True"]
    assert cli.main([*base, "--secret_file", str(secret_file), "-o", str(out_ok)]) == 0
    expected = "".join(s["text"].strip() + "\n" for s in local_beam5_words["segments"])
    assert (out_ok / "jfk.txt").read_text() == expected
    capsys.readouterr()
    assert cli.main([*base, "--secret_file", str(wrong), "-o", str(out_bad)]) == 1
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert captured.out == "" and len(lines) == 1, captured
    assert (
        lines[0].startswith("whisperkv: error: ")
        and "refusing sealed cache: " in lines[0]
        and "hello's tag does not verify: the decoder holds another secret" in lines[0]
    )
    assert not out_bad.exists() or not any(out_bad.iterdir())  # no transcript, no partial file
    assert cli.main([*base, "--secret_file", str(tmp_path / "missing"), "-o", str(out_bad)]) == 2
    assert "secret file" in capsys.readouterr().err


def _sweep_files() -> list[str]:
    files = [str(clip_path(r)) for r in english_clips()]
    return files + [str(p) for p in sorted((SPEECH_DIR / "long").glob("*")) if p.suffix in (".flac", ".wav")]


@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [None, 5], ids=["greedy", "beam5"])
@pytest.mark.parametrize("carry", ["features", "cross_kv"])
def test_sweep_every_english_clip_and_long_file(tiny_model, thread_worker, process_worker, carry, beam_size):
    files = _sweep_files()
    assert len(files) >= 40
    url = thread_worker if carry == "features" else process_worker
    with RemoteEncoder(url, SECRET, carry=carry) as encoder:
        for path in files:
            local = tiny_model.transcribe(path, beam_size=beam_size, verbose=None)
            remote = tiny_model.transcribe(path, beam_size=beam_size, verbose=None, encoder=encoder)
            _same(remote, local)


def test_verify_remote_path_is_bit_identical(tiny_model, process_worker, speech_dir):
    """``whisperkv verify --encoder_url``: the worker's sealed Cross-KV equals the local one, same tokens."""
    from whisperkv.verify import add_remote_path

    report = {"paths": {}, "identical": True, "language": "en"}
    with RemoteEncoder(process_worker, SECRET, carry="cross_kv") as encoder:
        add_remote_path(report, tiny_model, str(speech_dir / "en" / "jfk.flac"), encoder)
    path = report["paths"]["sealed_remote"]
    assert path["identical"] and report["identical"]
    assert path["max_abs_cross_kv_diff"] == 0.0 and path["tokens"] > 20
