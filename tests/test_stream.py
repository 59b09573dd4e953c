"""Live transcription with the real model: reuse decisions, the command's events and its bad input."""

from __future__ import annotations

import io
import json
import sys
import types

import numpy as np
import pytest

from whisperkv.audio import load_audio
from whisperkv.cli import main
from whisperkv.decoding.decode import decode_window
from whisperkv.decoding.options import DecodingOptions
from whisperkv.metrics import wer
from whisperkv.stream.local_decoder import LocalDecoder
from whisperkv.stream.prompt_decode import decode_greedy

JFK = "en/jfk.flac"
JFK_TEXT = (
    "And so my fellow Americans, ask not what your country can do for you, "
    "ask what you can do for your country."
)


@pytest.fixture(scope="module")
def jfk(speech_dir) -> np.ndarray:
    return load_audio(speech_dir / JFK)


def pcm_bytes(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def run_cli(argv: list[str], monkeypatch, capsys, stdin: bytes | None = None) -> tuple[int, list[str], str]:
    if stdin is not None:
        pipe = types.SimpleNamespace(buffer=io.BufferedReader(io.BytesIO(stdin)), isatty=lambda: False)
        monkeypatch.setattr(sys, "stdin", pipe)
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def test_unchanged_buffer_reuses_everything_and_grown_buffer_is_refused(tiny_model, jfk):
    decoder = LocalDecoder(tiny_model)
    first = decoder.decode(jfk[: 5 * 16000], 0, "")
    again = decoder.decode(jfk[: 5 * 16000], 0, "")  # the same buffer and prompt: exact reuse
    assert again.words == first.words and decoder.encodes == 1
    summary = decoder.reuse_summary()
    assert summary["accepted"] == {"encoder_output": 1, "cross_kv": 1, "prompt_self_kv": 1}
    decoder.decode(jfk[: 6 * 16000], 0, "")  # the buffer grew: the log-Mel window differs
    summary = decoder.reuse_summary()
    assert summary["refused"]["encoder_output"] == {"mel_digest": 1}
    assert summary["refused"]["cross_kv"] == {"encoder.mel_digest": 1}
    assert summary["refused"]["prompt_self_kv"] == {"cross_kv.encoder.mel_digest": 1}
    assert decoder.encodes == 2 and summary["attempted"]["encoder_output"] == 2
    assert any("mel_digest" in r for r in decoder.store.refusals)


@pytest.mark.parametrize("model_name", ["tiny_model", "int8_model"])
def test_prompt_state_reuse_gives_the_tokens_of_a_full_decode(model_name, request, jfk, monkeypatch):
    # the stream's steps go through the plan's one-call step (``forward_rows``), the decode it is
    # compared with block by block (``model.decoder``): the same tokens and the same log-probabilities
    tiny_model = request.getfixturevalue(model_name)
    step = getattr(tiny_model.decoder, "decoder_step", None)
    calls = []
    if step is not None:  # counted where this CPU has the kernels
        real = step.logits
        monkeypatch.setattr(step, "logits", lambda *args: calls.append(1) or real(*args))
    decoder = LocalDecoder(tiny_model)
    decoder.decode(jfk[: 8 * 16000], 0, "")
    window = decoder.previous
    tokenizer = decoder.tokenizer
    options = DecodingOptions(language="en", prompt=tokenizer.encode(" Kennedy said:"))
    reference = decode_window(tiny_model, tokenizer, window.audio_features, options, cross_kv=window.cross_kv)
    fresh, state = decode_greedy(tiny_model, tokenizer, window, options)
    reused, _ = decode_greedy(tiny_model, tokenizer, window, options, reused=state)
    assert fresh.tokens == reference.tokens == reused.tokens
    assert reused.avg_logprob == reference.avg_logprob and reused.no_speech_prob == reference.no_speech_prob
    assert fresh.avg_logprob == reference.avg_logprob
    assert step is None or len(calls) >= 2 * len(fresh.tokens)  # both decodes took the one-call step


def test_stdin_stream_json_events_flush_and_reuse_summary(jfk, monkeypatch, capsys):
    # 7.5 s of jfk ends mid-sentence; the end of input must commit what was heard
    code, lines, err = run_cli(
        ["stream", "-", "--json", "--simulate_compute", "0.5"],
        monkeypatch,
        capsys,
        pcm_bytes(jfk[: 7 * 16000]),
    )
    assert code == 0 and err == ""
    events = [json.loads(line) for line in lines]
    summary = events.pop()
    assert summary["type"] == "reuse"
    assert {e["type"] for e in events} <= {"partial", "commit"}
    times = [e["audio_time"] for e in events]
    assert times == sorted(times)
    commits = [e for e in events if e["type"] == "commit"]
    assert all(b["start"] >= a["end"] - 0.1 for a, b in zip(commits, commits[1:]))  # never re-committed
    assert all(e["audio_time"] >= e["end"] for e in commits)
    text = " ".join(e["text"] for e in commits)
    assert wer("And so my fellow Americans, ask not what your country", text) <= 0.2
    for kind, n in summary["attempted"].items():
        assert n == summary["accepted"][kind] + sum(summary["refused"][kind].values())
    assert summary["encodes"] <= summary["updates"]


@pytest.mark.slow  # the file path differs from stdin only in its source; the default run covers stdin
def test_file_stream_plain_text_matches_the_speech(speech_dir, monkeypatch, capsys):
    code, lines, err = run_cli(
        ["stream", str(speech_dir / JFK), "--chunk", "2", "--simulate_compute", "0.5"], monkeypatch, capsys
    )
    assert code == 0 and lines
    assert wer(JFK_TEXT, " ".join(lines)) <= 0.15


def test_int8_stream_commits_the_speech_and_a_bad_compute_type_is_refused(jfk, monkeypatch, capsys):
    """``--compute_type int8`` (faster updates) streams the int8 model; an unknown type is exit 2."""
    data = pcm_bytes(jfk)
    code, lines, err = run_cli(
        ["stream", "-", "--compute_type", "int8", "--simulate_compute", "0.3", "--no_vad"],
        monkeypatch,
        capsys,
        data,
    )
    assert code == 0 and wer(JFK_TEXT, " ".join(lines)) <= 0.15, (lines, err)
    with pytest.raises(SystemExit) as refused:  # argparse's exit, before anything loads
        run_cli(["stream", "-", "--compute_type", "int4"], monkeypatch, capsys, data)
    out, err = capsys.readouterr()
    assert refused.value.code == 2 and out == "" and "--compute_type" in err and "'int4'" in err


def test_confident_commits_the_speech_sooner_and_a_bad_probability_is_refused(jfk, monkeypatch, capsys):
    """``--confident 0.5`` commits words the model is sure of at their first hearing: the same speech,
    each commit sooner after its last word's end on average than LocalAgreement-2 alone (jfk, 1 s chunks,
    0.3 s per update). A probability outside (0, 1] is exit 2 before anything loads."""
    data = pcm_bytes(jfk)
    delays, texts = {}, {}
    for policy, extra in (("agreement", []), ("confident", ["--confident", "0.5"])):
        argv = ["stream", "-", "--simulate_compute", "0.3", "--json", *extra]
        code, lines, err = run_cli(argv, monkeypatch, capsys, data)
        commits = [e for e in map(json.loads, lines) if e.get("type") == "commit"]
        assert code == 0 and commits, err
        texts[policy] = " ".join(e["text"] for e in commits)
        delays[policy] = np.mean([e["audio_time"] - e["end"] for e in commits])
    assert wer(JFK_TEXT, texts["confident"]) <= 0.15, texts
    assert delays["confident"] < delays["agreement"] - 0.2, delays
    for bad in ("0", "1.5", "nan"):
        with pytest.raises(SystemExit) as refused:
            run_cli(["stream", "-", "--confident", bad], monkeypatch, capsys, data)
        out, err = capsys.readouterr()
        assert refused.value.code == 2 and out == "" and "--confident" in err, err


def test_odd_byte_count_on_stdin_is_one_error_line_and_the_rest_is_transcribed(jfk, monkeypatch, capsys):
    data = pcm_bytes(jfk[: 4 * 16000]) + b"\x01"
    code, lines, err = run_cli(["stream", "-", "--simulate_compute", "0.5"], monkeypatch, capsys, data)
    assert code == 1
    assert err.count("\n") == 1 and "odd number of bytes" in err and "Traceback" not in err
    assert "fellow americans" in " ".join(lines).lower()


def test_unreadable_file_is_one_error_line(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "not_audio.wav"
    bad.write_bytes(b"this is not audio")
    code, lines, err = run_cli(["stream", str(bad)], monkeypatch, capsys)
    assert code == 2 and lines == []
    assert err.startswith("whisperkv: error:") and str(bad) in err and err.count("\n") == 1


def test_warm_runs_the_whole_path_once_and_forgets_it(tiny_model, jfk):
    cold = LocalDecoder(tiny_model).decode(jfk[: 3 * 16000], 0, "")
    decoder = LocalDecoder(tiny_model)
    decoder.warm()
    summary = decoder.reuse_summary()
    assert (decoder.updates, decoder.encodes, decoder.previous, decoder.prompt_state) == (0, 0, None, None)
    assert summary["attempted"] == {"encoder_output": 0, "cross_kv": 0, "prompt_self_kv": 0}
    assert decoder.store.refusals == [] and decoder.store.hits == []
    warm = decoder.decode(jfk[: 3 * 16000], 0, "")
    assert warm.words == cold.words and decoder.encodes == 1  # warming changes no word and no time


def test_a_multilingual_stream_given_no_language_detects_it_once(base_model, speech_dir):
    audio = load_audio(speech_dir / "xx/pv_test_fr.wav")
    decoder = LocalDecoder(base_model, None)
    assert decoder.state.detecting
    first = decoder.decode(audio[: 4 * 16000], 0, "")
    assert decoder.tokenizer.language == "fr" and not decoder.state.detecting and first.words
    decoder.warm()  # forgets the detection with the rest
    assert decoder.state.detecting and decoder.tokenizer.language == "en"
