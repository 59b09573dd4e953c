"""Batched long-form mode: chunks cut at pauses, decoded together, same tokens as one at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import whisperkv
from whisperkv.audio import N_FRAMES, N_SAMPLES, SAMPLE_RATE, log_mel_spectrogram
from whisperkv.batched import split_at_silences, transcribe_batched
from whisperkv.decoding.decode import decode_window, decode_windows
from whisperkv.decoding.options import DecodingOptions
from whisperkv.metrics import wer

CLIPS = [
    "lj_LJ001-0001.flac",
    "lj_LJ001-0003.flac",
    "lj_LJ001-0005.flac",
    "lj_LJ001-0007.flac",
    "lj_LJ001-0004.flac",
]


@pytest.fixture(scope="module")
def joined(speech_dir):
    gap = np.zeros(SAMPLE_RATE, dtype=np.float32)
    parts = []
    for name in CLIPS:
        parts += [whisperkv.load_audio(speech_dir / "en" / name), gap]
    return np.concatenate(parts)


def test_chunks_are_short_and_cover_the_speech(joined):
    chunks = split_at_silences(joined)
    assert len(chunks) >= 2
    assert all(0 < c.end - c.start <= 30 * SAMPLE_RATE for c in chunks)
    assert all(a.end <= b.start for a, b in zip(chunks, chunks[1:]))


@pytest.mark.parametrize(
    "compute_type, logprob_atol",
    # int8: the batch changes the int8 GEMMs' shapes and so their last bits; the tokens must not change.
    # Measured |Δ avg_logprob| per chunk: float32 1.3e-07 and 4.4e-08, int8 3.7e-04 and 6.4e-03.
    [("float32", 1e-5), ("int8", 0.02)],
)
def test_batched_decode_equals_one_window_at_a_time(
    tiny_model, int8_model, joined, monkeypatch, compute_type, logprob_atol
):
    """Chunks encoded and decoded together vs each chunk encoded alone and decoded alone."""
    from whisperkv.cache.kv import DecoderCache

    model = tiny_model if compute_type == "float32" else int8_model
    kept: list[int] = []  # finished rows are dropped from the batch on the way: make sure that ran
    keep_rows = DecoderCache.keep_rows
    monkeypatch.setattr(
        DecoderCache, "keep_rows", lambda self, rows: (kept.append(len(rows)), keep_rows(self, rows))
    )
    chunks = split_at_silences(joined)
    mels = torch.stack(
        [log_mel_spectrogram(joined[c.start : c.end], 80, padding=N_SAMPLES)[:, :N_FRAMES] for c in chunks]
    )
    options = DecodingOptions(language="en", without_timestamps=True)
    tokenizer = model.tokenizer
    features = model.embed_audio(mels)
    cross = model.decoder.project_cross_kv(features, model.encoder_provenance(mels))
    together = decode_windows(model, tokenizer, features, options, cross)
    for k in range(len(chunks)):
        alone = decode_window(model, tokenizer, model.embed_audio(mels[k : k + 1]), options)
        assert together[k].tokens == alone.tokens, f"chunk {k}"
        assert len(alone.tokens) > 10
        assert together[k].avg_logprob == pytest.approx(alone.avg_logprob, abs=logprob_atol)
    assert kept and kept[-1] < len(chunks)


def test_batched_transcript_close_to_sequential(tiny_model, joined):
    batched = transcribe_batched(tiny_model, joined)
    sequential = tiny_model.transcribe(joined)
    assert batched["batched"]["chunks"] >= 2
    assert wer(sequential["text"], batched["text"]) <= 0.05
    assert [s["start"] for s in batched["segments"]] == sorted(s["start"] for s in batched["segments"])


def test_batches_are_balanced_and_bad_sizes_refused(tiny_model, joined):
    result = transcribe_batched(tiny_model, joined, batch_size=2)
    sizes = result["batched"]["batches"]
    assert sum(sizes) == result["batched"]["chunks"] and max(sizes) <= 2
    assert max(sizes) - min(sizes) <= 1  # no small leftover batch paying a full batch's steps
    with pytest.raises(ValueError, match="batch_size"):
        transcribe_batched(tiny_model, joined, batch_size=0)
