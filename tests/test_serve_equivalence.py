"""The headline property: requests served concurrently (one scheduler, batched decoder steps) get exactly
what ``model.transcribe`` of the same file and options gives alone — text, segments, tokens, timestamps,
words — through the official ``openai`` client against a real server on 127.0.0.1.

Default run: 8+ concurrent requests mixing short clips, a multi-window file, beam 5, word timestamps and a
clip that needs temperature fallback, in several response formats. ``-m slow``: 32+ concurrent, every
English clip, both long-form files and translation with ``base``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import SPEECH_DIR, clip_path, english_clips, require_oracle, speech_manifest
from tests.test_serve_harness import API_KEY, live_server, make_app, write_wav

openai = require_oracle("openai")

#: a log-probability threshold no greedy decode reaches: every window falls back through the schedule,
#: sampling from the job's own seeded generator (none of the clips needs fallback with the defaults)
FALLBACK = {"logprob_threshold": 0.0}
REQUEST_TIMEOUT_S = 300

# the fields of a verbose_json segment, as OpenAI documents them (and openai-whisper produces them)
SEGMENT_FIELDS = (
    "id",
    "seek",
    "start",
    "end",
    "text",
    "tokens",
    "temperature",
    "avg_logprob",
    "compression_ratio",
    "no_speech_prob",
)


@dataclass
class Case:
    """One request: the file, the client's arguments, and the transcribe() options they mean."""

    name: str
    path: Path
    response_format: str = "verbose_json"
    client_args: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)  # what transcribe() is called with for the reference
    words: bool = False
    model: str = "whisper-1"
    translate: bool = False
    falls_back: bool = False  # the reference result must hold a segment decoded at temperature > 0


def _request(client, case: Case):
    args = dict(case.client_args)
    if case.words:
        args["timestamp_granularities"] = ["word", "segment"]
    with open(case.path, "rb") as f:
        endpoint = client.audio.translations if case.translate else client.audio.transcriptions
        return endpoint.create(file=f, model=case.model, response_format=case.response_format, **args)


def _expected(model, case: Case):
    from whisperkv.writers import render

    torch.manual_seed(0)
    solo = model.transcribe(
        str(case.path), **case.options, **({"word_timestamps": True} if case.words else {})
    )
    if case.response_format == "text":
        return solo["text"] + "\n"
    if case.response_format in ("srt", "vtt"):
        return render(solo, case.response_format)
    if case.response_format == "json":
        return {"text": solo["text"]}
    segments = []
    for s in solo["segments"]:
        seg = {name: s[name] for name in SEGMENT_FIELDS}
        if case.words:
            seg["words"] = [dict(w) for w in s["words"]]
        segments.append(seg)
    body = {"text": solo["text"], "segments": segments}
    if case.words:
        body["words"] = [
            {"word": w["word"], "start": w["start"], "end": w["end"]} for s in segments for w in s["words"]
        ]
    return body


def _observed(response, case: Case):
    if isinstance(response, str):
        return response
    body = response.model_dump()
    if case.response_format == "json":
        return {"text": body["text"]}
    out = {"text": body["text"], "segments": []}
    for s in body["segments"]:
        seg = {name: s[name] for name in SEGMENT_FIELDS}
        if case.words:
            seg["words"] = s["words"]
        out["segments"].append(seg)
    if case.words:
        out["words"] = [{"word": w["word"], "start": w["start"], "end": w["end"]} for w in body["words"]]
    return out


def _run_concurrently(url: str, cases: list[Case]) -> list:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=REQUEST_TIMEOUT_S)
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:
        return list(pool.map(lambda case: _request(client, case), cases))


def _assert_identical(model, cases: list[Case], responses: list) -> None:
    mismatches = []
    for case, response in zip(cases, responses):
        expected, observed = _expected(model, case), _observed(response, case)
        if expected != observed:
            mismatches.append(f"{case.name}:\n  served {observed!r:.2000}\n  alone  {expected!r:.2000}")
    assert not mismatches, "\n".join(mismatches)


@pytest.fixture(scope="module")
def multi_window_file(tmp_path_factory, speech_dir) -> Path:
    """53 s: two clips with a second of silence between, so three windows whose seek follows the text."""
    from whisperkv.audio import load_audio

    a = load_audio(speech_dir / "en" / "mfa_acoustic_corpus.wav")
    b = load_audio(speech_dir / "en" / "mfa_cold_corpus.wav")
    audio = np.concatenate([a, np.zeros(16000, dtype=np.float32), b])
    return write_wav(tmp_path_factory.mktemp("serve") / "two_clips.wav", audio)


def _default_cases(multi_window_file: Path) -> list[Case]:
    en = SPEECH_DIR / "en"
    return [
        Case("short greedy", en / "ls_1089-134686-0001.flac"),
        Case("short json", en / "lj_LJ001-0002.flac", response_format="json"),
        Case("short text", en / "ls_1089-134691-0000.flac", response_format="text"),
        Case("srt", en / "sb_example1.wav", response_format="srt"),
        Case("multi-window", multi_window_file),
        Case(
            "beam 5", en / "jfk.flac", client_args={"extra_body": {"beam_size": 5}}, options={"beam_size": 5}
        ),
        Case("word timestamps", en / "ls_1089-134686-0000.flac", words=True),
        Case(
            "fallback",
            en / "ls_1089-134691-0000.flac",
            client_args={"extra_body": FALLBACK},
            options=FALLBACK,
            falls_back=True,
        ),
        Case(
            "prompt, vtt, no conditioning",
            en / "mfa_her.flac",
            response_format="vtt",
            client_args={"prompt": "Her.", "extra_body": {"condition_on_previous_text": False}},
            options={"initial_prompt": "Her.", "condition_on_previous_text": False},
        ),
    ]


def test_concurrent_requests_identical_to_solo_transcribe(tiny_model, speech_dir, multi_window_file):
    cases = _default_cases(multi_window_file)
    assert len(cases) >= 8
    with live_server(make_app(tiny_model, max_batch=16)) as url:
        responses = _run_concurrently(url, cases)
    _assert_identical(tiny_model, cases, responses)


@pytest.mark.slow
def test_32_concurrent_with_long_form_and_translation(tiny_model, speech_dir, multi_window_file):
    long_files = sorted((SPEECH_DIR / "long").glob("*.flac"))
    assert len(long_files) == 2
    cases = _default_cases(multi_window_file)
    variants = [
        {},
        {"client_args": {"extra_body": {"beam_size": 5}}, "options": {"beam_size": 5}},
        {"words": True},
        {"response_format": "srt"},
    ]
    for i, row in enumerate(english_clips()):
        cases.append(Case(f"{row['id']} #{i % 4}", clip_path(row), **variants[i % 4]))
    cases += [Case(f"long {p.name}", p) for p in long_files]
    cases.append(Case(f"long words {long_files[0].name}", long_files[0], words=True))
    assert len(cases) >= 32
    with live_server(make_app(tiny_model, max_batch=16, max_queue=64, max_upload_bytes=32 * 2**20)) as url:
        responses = _run_concurrently(url, cases)
    _assert_identical(tiny_model, cases, responses)


@pytest.mark.slow
def test_translation_with_base_concurrent(base_model, speech_dir):
    from whisperkv.engine import Scheduler
    from whisperkv.serve import ServeSettings, create_app

    rows = [r for r in speech_manifest() if r["language"] != "en"]
    assert rows
    cases = [Case(f"translate {r['id']}", clip_path(r), model="base", translate=True) for r in rows]
    cases += [Case(f"transcribe {r['id']}", clip_path(r), model="base") for r in rows]
    for case in cases:
        case.options = {"task": "translate"} if case.translate else {}
    settings = ServeSettings(model_name="base", api_key=API_KEY)
    with live_server(create_app(base_model, Scheduler(base_model), settings)) as url:
        responses = _run_concurrently(url, cases)
    _assert_identical(base_model, cases, responses)
