"""The engine: a job driven by the scheduler gives transcribe()'s result, alone or batched with others."""

from __future__ import annotations

import pytest

import whisperkv
from whisperkv.engine import Scheduler

from .conftest import SPEECH_DIR


def _audio(name: str, seconds: float | None = None):
    path = SPEECH_DIR / name
    if not path.is_file():
        pytest.skip(f"{path} not found")
    audio = whisperkv.load_audio(path)
    return audio[: int(seconds * 16000)] if seconds else audio


def test_one_job_equals_transcribe(tiny_model):
    audio = _audio("en/jfk.flac")
    expected = tiny_model.transcribe(audio)
    scheduler = Scheduler(tiny_model)
    result = scheduler.run(scheduler.submit(audio))
    assert result == expected
    assert result["text"].strip().startswith("And so my fellow Americans")


def test_batched_jobs_equal_their_solo_runs(tiny_model):
    audios = [_audio("en/jfk.flac"), _audio("en/lj_LJ001-0002.flac"), _audio("en/timit_LDC93S1.wav")]
    solo = [tiny_model.transcribe(a) for a in audios]
    scheduler = Scheduler(tiny_model, max_batch=8)
    handles = [scheduler.submit(a) for a in audios]
    widest = 0
    while not all(h.done for h in handles):
        scheduler.tick()
        widest = max(widest, scheduler.stats()["last_batch_rows"])
    assert widest == 3  # the three jobs really shared decoder steps
    assert [h.result() for h in handles] == solo
