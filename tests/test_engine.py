"""The engine: a job driven by the scheduler gives transcribe()'s result, alone or batched with others.

Equality here is ``==`` on whole result dicts (text, segments with tokens, timestamps, avg_logprob,
compression ratio, no-speech probability, words, cache report): a batched row must give its solo
run's numbers bit for bit, not approximately.
"""

from __future__ import annotations

import time

import pytest
import torch

import whisperkv
from whisperkv.decoding.decode import initial_tokens
from whisperkv.decoding.options import DecodingOptions
from whisperkv.decoding.window import WindowDecode
from whisperkv.engine import Job, Scheduler, TranscribeOptions
from whisperkv.errors import CacheReuseError, JobCancelledError, QueueFullError, ShuttingDownError

from .conftest import SPEECH_DIR
from .conftest import speech_audio as _audio

SHORT = ["en/jfk.flac", "en/lj_LJ001-0002.flac", "en/timit_LDC93S1.wav"]
LONG = "long/lj001_0001-0032_concat.flac"


def _solo(model, audio, options: dict) -> dict:
    torch.manual_seed(0)  # a sampling fallback draws from the job's generator, seeded from here
    return model.transcribe(audio, **options)


def _run_batched(scheduler: Scheduler, jobs: list[tuple]) -> tuple[list[dict], int]:
    """Submit every (audio, options) job, tick until all are done; results and the widest step."""
    handles = []
    for audio, options in jobs:
        torch.manual_seed(0)
        handles.append(scheduler.submit(audio, options))
    widest = 0
    while not all(h.done for h in handles):
        scheduler.tick()
        widest = max(widest, scheduler.stats()["last_batch_rows"])
    return [h.result() for h in handles], widest


@pytest.fixture(scope="module")
def solo_short(tiny_model):
    return [_solo(tiny_model, _audio(name), {}) for name in SHORT]


def test_one_job_equals_transcribe(tiny_model, solo_short):
    scheduler = Scheduler(tiny_model)
    result = scheduler.run(scheduler.submit(_audio(SHORT[0])))
    assert result == solo_short[0]
    assert result["text"].strip().startswith("And so my fellow Americans")
    assert set(result) == {"text", "segments", "language", "cache"}


def test_batched_jobs_equal_their_solo_runs(tiny_model, solo_short):
    scheduler = Scheduler(tiny_model, max_batch=8)
    results, widest = _run_batched(scheduler, [(_audio(name), {}) for name in SHORT])
    assert widest == 3  # the three jobs really shared decoder steps
    assert results == solo_short
    stats = scheduler.stats()
    assert stats["active_rows"] == 0 and stats["self_kv_bytes"] == 0 and stats["cross_kv_bytes"] == 0


def test_mixed_batch_beam_words_fallback_best_of(tiny_model, solo_short):
    """Greedy, beam 5, word timestamps, a forced sampling fallback with best-of: one batch, solo results."""
    jfk = _audio(SHORT[0])
    variants = [
        {"beam_size": 5},
        {"word_timestamps": True},
        # every window is "improbable" (avg log-prob < 0): the whole temperature schedule runs, sampling
        # best_of rows from the job's own generator
        {"logprob_threshold": 0.0, "temperature": (0.0, 0.4, 0.8), "best_of": 3},
    ]
    solo = [_solo(tiny_model, jfk, v) for v in variants]
    assert solo[2]["segments"][0]["temperature"] == 0.8  # the fallback really ran
    scheduler = Scheduler(tiny_model, max_batch=16)
    jobs = [(jfk, v) for v in variants] + [(_audio(SHORT[1]), {})]
    results, widest = _run_batched(scheduler, jobs)
    assert widest >= 5 + 1 + 1 + 1  # all four windows in one step
    assert results[:3] == solo
    assert results[3] == solo_short[1]


def test_cancel_frees_rows_and_others_go_on(tiny_model, solo_short):
    scheduler = Scheduler(tiny_model, max_batch=8)
    keep = scheduler.submit(_audio(SHORT[0]))
    drop = scheduler.submit(_audio(SHORT[0]), {"beam_size": 5})
    for _ in range(3):
        scheduler.tick()
    assert scheduler.stats()["active_rows"] == 6
    drop.cancel()
    scheduler.tick()
    assert scheduler.stats()["active_rows"] == 1 and scheduler.stats()["active_jobs"] == 1
    with pytest.raises(JobCancelledError):
        drop.result(timeout=0)
    assert list(drop.segments()) == []
    assert scheduler.run(keep) == solo_short[0]


def test_queue_full_and_shutting_down(tiny_model):
    audio = _audio(SHORT[2])
    scheduler = Scheduler(tiny_model, max_queue=2)
    first, second = scheduler.submit(audio), scheduler.submit(audio)
    with pytest.raises(QueueFullError):
        scheduler.submit(audio)
    scheduler.stop(drain=False)
    with pytest.raises(ShuttingDownError):
        scheduler.submit(audio)
    for handle in (first, second):
        with pytest.raises(JobCancelledError):
            handle.result(timeout=0)


def test_bad_options_are_refused_at_submit(tiny_model):
    scheduler = Scheduler(tiny_model)
    with pytest.raises(ValueError, match="unknown transcribe option 'beam_szie'"):
        scheduler.submit(_audio(SHORT[2]), {"beam_szie": 5})
    with pytest.raises(ValueError, match="patience requires beam_size"):
        scheduler.submit(_audio(SHORT[2]), {"patience": 2.0})
    with pytest.raises(ValueError, match="length_penalty"):
        scheduler.submit(_audio(SHORT[2]), {"length_penalty": 3.0})
    with pytest.raises(whisperkv.AudioError):
        scheduler.submit(str(SPEECH_DIR / "en" / "missing.flac"))
    assert scheduler.stats()["queue_depth"] == 0


def test_background_thread_streams_segments(tiny_model, solo_short):
    scheduler = Scheduler(tiny_model)
    scheduler.start()
    try:
        handle = scheduler.submit(_audio(SHORT[1]))
        streamed = list(handle.segments())
        assert handle.result(timeout=60) == solo_short[1]
        assert streamed == solo_short[1]["segments"]
    finally:
        scheduler.stop(drain=True, timeout=60)
    with pytest.raises(ShuttingDownError):
        scheduler.submit(_audio(SHORT[1]))


def test_caches_name_their_request_and_refuse_another(tiny_model):
    """Two requests for the SAME audio: every layer's Self-KV and Cross-KV names its own request."""
    audio = _audio(SHORT[2])
    scheduler = Scheduler(tiny_model, max_batch=8)
    a = scheduler.submit(audio, request_id="req-a")
    b = scheduler.submit(audio, request_id="req-b", options={"beam_size": 2})
    scheduler.tick()
    held = scheduler.held_caches()
    assert sorted(h["request_id"] for h in held) == ["req-a", "req-b"]
    for h in held:
        assert h["cross_kv"] == [h["request_id"]] * 4  # one per decoder layer
        assert h["self_kv"] == [[h["request_id"]] * h["rows"]] * 4
    # one request's window offered to the other is refused, naming the field
    jobs = {j.request_id: j for j in scheduler.active_jobs()}
    window_a = next(iter(jobs["req-a"].store.entries.values()))
    window_b = next(iter(jobs["req-b"].store.entries.values()))
    assert window_a.provenance.mel_digest == window_b.provenance.mel_digest  # same audio, same window
    with pytest.raises(CacheReuseError, match="request_id"):
        jobs["req-b"].store.offer(window_a, window_b.provenance)
    with pytest.raises(CacheReuseError, match="request_id"):
        WindowDecode(tiny_model, jobs["req-b"].tokenizer, DecodingOptions(), window_a, request_id="req-b")
    scheduler.stop(drain=False)
    assert a.done and b.done


def test_hotwords_prompt_follows_faster_whisper(tiny_model):
    tokenizer = tiny_model.tokenizer.with_options(language="en")
    hot = tokenizer.encode(" Kennedy Americans")
    sot = list(tokenizer.sot_sequence)
    options = DecodingOptions(hotwords="Kennedy Americans")
    assert initial_tokens(tokenizer, options, 448, 224) == [tokenizer.sot_prev, *hot, *sot]
    with_prev = DecodingOptions(hotwords="Kennedy Americans", prompt=[1, 2, 3])
    assert initial_tokens(tokenizer, with_prev, 448, 224) == [tokenizer.sot_prev, *hot, 1, 2, 3, *sot]
    # a prefix switches hotwords off
    with_prefix = DecodingOptions(hotwords="Kennedy", prefix="And so")
    assert tokenizer.sot_prev not in initial_tokens(tokenizer, with_prefix, 448, 224)
    # capped at half the context less one
    long = DecodingOptions(hotwords=" ".join(["word"] * 400))
    assert len(initial_tokens(tokenizer, long, 448, 224)) == 1 + 223 + len(sot)


def test_hotwords_transcribe_option(tiny_model):
    result = tiny_model.transcribe(_audio(SHORT[2]), hotwords="greasy wash water", temperature=0.0)
    assert "greasy wash water" in result["text"]
    with pytest.raises(ValueError, match="unknown transcribe option"):
        TranscribeOptions.from_dict({"hotword": "x"})


@pytest.mark.slow
def test_multi_window_job_batched_equals_solo(tiny_model, solo_short):
    """70 s of the long file (three windows, previous-text prompts) beside short clips and beams."""
    long70 = _audio(LONG, 70)
    solo_long = _solo(tiny_model, long70, {})
    assert len({s["seek"] for s in solo_long["segments"]}) >= 3
    solo_beam = _solo(tiny_model, long70, {"beam_size": 5})
    scheduler = Scheduler(tiny_model, max_batch=16)
    jobs = [(long70, {}), (long70, {"beam_size": 5})] + [(_audio(name), {}) for name in SHORT]
    results, widest = _run_batched(scheduler, jobs)
    assert widest >= 8
    assert results == [solo_long, solo_beam, *solo_short]


def test_job_is_the_loop_transcribe_runs(tiny_model, solo_short):
    """Driving a Job by hand (what the scheduler does) gives transcribe()'s result."""
    job = Job(tiny_model, _audio(SHORT[1]), TranscribeOptions.from_dict({}), request_id="by-hand")
    scheduler = Scheduler(tiny_model)
    assert scheduler.run(scheduler.submit_job(job)) == solo_short[1]
    assert job.finished and not job.store.entries


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS"))


def test_an_idle_background_loop_gives_the_heap_back_once(tiny_model, solo_short):
    """After idle_trim_s with nothing to do, the loop returns the heap's free memory to the kernel (RSS
    drops by the job's freed activations), once per idle spell, never before the first job; the next job
    still gets its solo result."""
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="idle_trim_s"):
            Scheduler(tiny_model, idle_trim_s=bad)
    scheduler = Scheduler(tiny_model, idle_trim_s=0.3)
    scheduler.start()
    try:
        time.sleep(0.6)
        assert scheduler.stats()["heap_trims"] == 0  # nothing to give back before the first job
        assert scheduler.submit(_audio(SHORT[0])).result(timeout=60) == solo_short[0]
        before = _rss_mb()
        deadline = time.monotonic() + 10
        while scheduler.stats()["heap_trims"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert scheduler.stats()["heap_trims"] == 1
        assert _rss_mb() < before - 10  # a jfk window's activations (about 50 MB) went back
        time.sleep(0.9)
        assert scheduler.stats()["heap_trims"] == 1  # once per idle spell
        assert scheduler.submit(_audio(SHORT[0])).result(timeout=60) == solo_short[0]
        deadline = time.monotonic() + 10
        while scheduler.stats()["heap_trims"] == 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert scheduler.stats()["heap_trims"] == 2
    finally:
        scheduler.stop(drain=True, timeout=60)


def test_the_encoder_time_is_counted_once_per_window_encoded(tiny_model):
    """``windows_encoded`` / ``encoder_seconds`` (the server's encoder-bound ceiling): a window redone at
    higher temperatures (logprob_threshold 0 refuses every attempt) reuses its encoder output and is
    counted once; each further clip's window adds one, and the time only grows."""
    scheduler = Scheduler(tiny_model)
    assert scheduler.stats()["windows_encoded"] == 0 and scheduler.stats()["encoder_seconds"] == 0
    result = scheduler.run(scheduler.submit(_audio(SHORT[0]), {"logprob_threshold": 0.0}))
    assert {s["temperature"] for s in result["segments"]} == {1.0}  # every temperature was tried
    first = scheduler.stats()
    assert first["windows_encoded"] == 1 and first["encoder_seconds"] > 0
    handles = [scheduler.submit(_audio(name)) for name in SHORT[1:]]
    while not all(h.done for h in handles):
        scheduler.tick()
    after = scheduler.stats()
    assert after["windows_encoded"] == 1 + len(SHORT[1:])
    assert after["encoder_seconds"] > first["encoder_seconds"]
