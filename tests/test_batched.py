"""Batched long-form mode: chunks cut at pauses, decoded together, same tokens as one at a time; real
segment timestamps, no words lost against the sequential mode, a progress bar."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import tqdm

import whisperkv
from tests.conftest import speech_manifest
from whisperkv.audio import N_FRAMES, N_SAMPLES, SAMPLE_RATE, load_audio, log_mel_spectrogram
from whisperkv.batched import speech_frames, split_at_silences, transcribe_batched
from whisperkv.chunking import FRAME, long_pause
from whisperkv.decoding.decode import decode_window, decode_windows
from whisperkv.decoding.logit_filters import hold_end_of_text
from whisperkv.decoding.options import DecodingOptions
from whisperkv.metrics import normalize_text, wer, word_errors

MAX_CUE_CHARS = 200  # longer than a sentence of these clips (the longest is 182): one cue per chunk is 400+

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


def test_chunks_are_short_and_cover_the_speech(joined, speech_dir):
    chunks = split_at_silences(joined)
    assert len(chunks) >= 2
    assert all(0 < c.end - c.start <= 30 * SAMPLE_RATE for c in chunks)
    assert all(a.end <= b.start for a, b in zip(chunks, chunks[1:]))
    covered = np.zeros(len(joined) // 320, dtype=bool)
    for c in chunks:
        covered[c.start // 320 : c.end // 320] = True
    assert not (speech_frames(joined) & ~covered).any()  # every loud frame is in a chunk
    cut = [c.end / SAMPLE_RATE for c in chunks[:-1]]
    gaps = np.cumsum([len(whisperkv.load_audio(speech_dir / "en" / n)) / SAMPLE_RATE + 1.0 for n in CLIPS])
    # a cut goes in a 1 s pause between clips (each ends at gaps[i] - 1), not in a breath inside a sentence
    assert all(any(g - 1.0 <= t <= g for g in gaps) for t in cut), (cut, gaps)


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
    result = transcribe_batched(tiny_model, joined, batch_size=2, timestamps=False)  # each chunk once
    sizes = result["batched"]["batches"]
    assert sum(sizes) == result["batched"]["chunks"] == result["batched"]["windows"] and max(sizes) <= 2
    assert max(sizes) - min(sizes) <= 1  # no small leftover batch paying a full batch's steps
    assert len(result["segments"]) == result["batched"]["chunks"]  # one segment per chunk
    with pytest.raises(ValueError, match="batch_size"):
        transcribe_batched(tiny_model, joined, batch_size=0)


def test_segments_are_sentence_cues_at_real_times(tiny_model, joined, speech_dir):
    """Default: segments at the decoder's timestamps, in order, inside the audio, subtitle-sized."""
    result = transcribe_batched(tiny_model, joined)
    segments = result["segments"]
    duration = len(joined) / SAMPLE_RATE
    assert len(segments) >= len(CLIPS) > result["batched"]["chunks"]  # not one cue per chunk
    assert [s["id"] for s in segments] == list(range(len(segments)))
    for a, b in zip(segments, segments[1:]):
        assert a["start"] <= b["start"] and a["end"] <= b["end"] and a["end"] <= b["start"] + 0.01, (a, b)
    for s in segments:
        assert 0 <= s["start"] < s["end"] <= duration + 0.01, s
        assert 0 < len(s["text"]) <= MAX_CUE_CHARS, s["text"]
    # the times are where the words are: the fourth clip's first words start within 1 s of its onset
    lengths = [len(whisperkv.load_audio(speech_dir / "en" / n)) / SAMPLE_RATE for n in CLIPS]
    onset = sum(lengths[:3]) + 3.0
    earliest = next(s for s in segments if "earliest book" in s["text"])
    assert abs(earliest["start"] - onset) < 1.0, (earliest, onset)
    assert abs(segments[-1]["end"] - (duration - 1.0)) < 1.0  # the last words end where the speech does


@pytest.fixture(scope="module")
def three_clips(speech_dir):
    """Two long sentences and a short one, with pauses. Chunks cut at the latest 0.2 s pause split the
    short one in a breath and kept "watch for all year" of it (13 word errors against sequential's 6)."""
    rows = {r["id"]: r for r in speech_manifest()}
    parts, texts = [np.zeros(SAMPLE_RATE, dtype=np.float32)], []
    for clip, pause in (("lj_LJ001-0003", 2.0), ("ls_1688-142285-0000", 1.5), ("timit_LDC93S1", 1.0)):
        parts += [load_audio(speech_dir / rows[clip]["file"]), np.zeros(int(pause * SAMPLE_RATE), np.float32)]
        texts.append(rows[clip]["reference"])
    return np.concatenate(parts), " ".join(texts)


def test_batched_loses_no_words_against_sequential(tiny_model, three_clips):
    audio, reference = three_clips
    batched = transcribe_batched(tiny_model, audio)["text"]
    sequential = tiny_model.transcribe(audio, beam_size=None)["text"]
    errors, words = word_errors(reference, batched)
    assert errors <= word_errors(reference, sequential)[0] + 3, (batched, sequential)
    lost = set(normalize_text(sequential).split()) - set(normalize_text(batched).split())
    assert len(lost) <= 2, lost  # the last sentence, after a pause, is there
    assert "greasy wash water" in normalize_text(batched)


def test_long_pause_is_the_middle_of_the_longest_silence_between_words():
    speech = np.zeros(500, dtype=bool)
    speech[10:50] = speech[80:120] = speech[250:300] = True  # pauses of 30 and 130 frames between words
    assert long_pause(speech, 0, 500 * FRAME) == (120 + 65) * FRAME
    assert long_pause(speech, 0, 200 * FRAME) is None  # 0.6 s: a pause inside a segment, not a skip
    assert long_pause(speech, 60 * FRAME, 500 * FRAME) == (120 + 65) * FRAME
    assert long_pause(speech, 300 * FRAME, 500 * FRAME) is None  # silence only


def test_beam_search_keeps_the_sentence_before_a_long_pause(tiny_model, speech_dir):
    """Beam 5 read this chunk as one segment "<|0.00|> For although ... process.<|15.28|>": every
    candidate skipped the first sentence. A segment across a 2.5 s pause is decoded again, split there."""
    rows = {r["id"]: r for r in speech_manifest()}
    silence = [np.zeros(int(s * SAMPLE_RATE), np.float32) for s in (1.0, 2.5, 1.0)]
    first, second = (load_audio(speech_dir / rows[c]["file"]) for c in ("timit_LDC93S1", "lj_LJ001-0003"))
    audio = np.concatenate([silence[0], first, silence[1], second, silence[2]])
    result = transcribe_batched(tiny_model, audio, beam_size=5)
    text = normalize_text(result["text"])
    assert "greasy wash water all year" in text and "by a similar process" in text, text
    assert text.index("greasy") < text.index("although")
    reference = " ".join(rows[c]["reference"] for c in ("timit_LDC93S1", "lj_LJ001-0003"))
    assert word_errors(reference, result["text"])[0] <= 4, text


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_counts_the_whole_audio_with_verbose(tiny_model, three_clips, monkeypatch):
    audio, _ = three_clips
    bars: list[tqdm.tqdm] = []

    class Recorded(tqdm.tqdm):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.steps: list[float] = []
            self.shown = not self.disable  # closing sets disable
            bars.append(self)

        def update(self, n=1):
            self.steps.append(n)
            return super().update(n)

    screen = _TTY()
    monkeypatch.setattr("sys.stderr", screen)
    monkeypatch.setattr(tqdm, "tqdm", Recorded)
    transcribe_batched(tiny_model, audio, verbose=True)
    (bar,) = bars
    total = round(len(audio) / SAMPLE_RATE, 2)
    assert bar.shown and bar.total == total
    assert all(step >= 0 for step in bar.steps) and sum(bar.steps) == pytest.approx(total, abs=0.02)
    assert f"/{total}" in screen.getvalue() and "s/s" in screen.getvalue()  # drawn, in seconds of audio
    bars.clear()
    transcribe_batched(tiny_model, audio, verbose=False)
    assert not bars[0].shown


def test_a_fallback_window_is_redecoded_from_its_batch_row_not_encoded_again(
    tiny_model, speech_dir, monkeypatch
):
    """A window redone at a higher temperature reads its row of the batch's encoder output: the encoder
    runs once per window, fallbacks or not. With the log-probability threshold at 0 every window is
    improbable, so each is redone up to the last temperature."""
    audio = whisperkv.load_audio(speech_dir / "en" / "jfk.flac")
    windows_encoded: list[int] = []
    embed_audio = tiny_model.embed_audio
    monkeypatch.setattr(
        tiny_model, "embed_audio", lambda mel: windows_encoded.append(mel.shape[0]) or embed_audio(mel)
    )
    result = transcribe_batched(tiny_model, audio, logprob_threshold=0.0, language="en")
    assert result["batched"]["fallbacks"] == result["batched"]["windows"] == 1
    assert windows_encoded == [1]
    assert result["segments"] and {s["temperature"] for s in result["segments"]} == {1.0}  # the last one


@pytest.mark.parametrize("compute_type", ["float32", "int8"])
def test_beam_windows_leave_the_batch_once_their_candidates_are_in(
    tiny_model, int8_model, joined, monkeypatch, compute_type
):
    """A beam window that holds all the candidates it keeps is dropped from the batch (its rows and caches):
    the tokens are those of the batch that keeps every window to the end. int8 rows are each their own
    (per-row quantisation, attention per window): the same scores bit for bit; float32's GEMMs over fewer
    rows may round differently in the last bit."""
    from whisperkv.cache.kv import DecoderCache

    model = tiny_model if compute_type == "float32" else int8_model
    dropped: list[tuple[int, int]] = []  # (Self-KV rows, Cross-KV windows) kept each time
    keep_rows = DecoderCache.keep_rows
    monkeypatch.setattr(
        DecoderCache,
        "keep_rows",
        lambda self, rows, windows=None: (
            dropped.append((len(rows), len(windows))),
            keep_rows(self, rows, windows),
        ),
    )
    chunks = split_at_silences(joined)
    mels = torch.stack(
        [log_mel_spectrogram(joined[c.start : c.end], 80, padding=N_SAMPLES)[:, :N_FRAMES] for c in chunks]
    )
    options = DecodingOptions(language="en", beam_size=5)
    features = model.embed_audio(mels)
    provenance = model.encoder_provenance(mels)
    results = {}
    for drop in (True, False):
        cross = model.decoder.project_cross_kv(features, provenance)
        results[drop] = decode_windows(model, model.tokenizer, features, options, cross, drop_finished=drop)
    assert dropped and all(rows == 5 * windows for rows, windows in dropped)
    assert dropped[-1][1] < len(chunks)  # windows left before the last step
    for fast, slow in zip(results[True], results[False], strict=True):
        assert fast.tokens == slow.tokens and len(fast.tokens) > 10
        if compute_type == "int8":
            assert fast.avg_logprob == slow.avg_logprob
        else:
            assert fast.avg_logprob == pytest.approx(slow.avg_logprob, abs=1e-5)


def test_end_of_text_is_held_until_the_text_reaches_the_floor():
    ts, eot, vocab = 10, 3, 10 + 21  # timestamps 0..20 at ids 10..30
    text = 5
    rows = [
        [ts + 0, text, text],  # text last: its window counts as decoded to its end
        [ts + 0, text, ts + 4],  # closed at 4 < floor 8: held
        [ts + 0, text, ts + 4, ts + 12],  # a pair: the text ended at 4 (the earlier stamp), held
        [ts + 0, text, ts + 9],  # closed at 9 >= floor 8: free
        [ts + 0, text, ts + 4],  # closed at 4, but the decoder is sure of its end of text: free
    ]
    width = max(map(len, rows))
    tokens = torch.tensor([[text] * (width - len(r)) + r for r in rows])  # left-padding leaves the last two
    bounds = torch.tensor([[8, 15]] * len(rows))
    logits = torch.zeros(len(rows), vocab)
    logits[-1, eot] = 8.0  # e^8 / (e^8 + 30) = 0.99 > 0.9
    logits[1, eot] = 5.0  # e^5 / (e^5 + 30) = 0.83: still held
    hold_end_of_text(logits, tokens, bounds, ts, eot, sure=0.9)
    held = torch.isinf(logits[:, eot]).tolist()
    assert held == [False, True, True, False, False]
    for r, is_held in enumerate(held):  # while held, no stamp past the ceiling; nothing else touched
        past = torch.isinf(logits[r, ts + 16 :]).all().item()
        assert past == is_held
        assert not torch.isinf(logits[r, ts : ts + 16]).any()
        assert not torch.isinf(logits[r, :eot]).any() and not torch.isinf(logits[r, eot + 1 : ts]).any()
    untouched = torch.zeros(1, vocab)
    hold_end_of_text(untouched, torch.tensor([[ts]]), torch.tensor([[8, 15]]), ts, eot)
    assert not torch.isinf(untouched).any()  # only the opening stamp: the rules force text next anyway


@pytest.fixture(scope="module")
def four_clips(speech_dir):
    """Four clips 1 s apart. Without the hold, tiny.en int8 ends one chunk's text a sentence early and
    that chunk's rest is encoded and decoded again as a fourth window (measured: 4 windows against 3,
    11 word errors either way)."""
    rows = {r["id"]: r for r in speech_manifest()}
    parts, texts = [np.zeros(SAMPLE_RATE // 2, dtype=np.float32)], []
    for clip in ("lj_LJ001-0002", "ls_61-70968-0000", "mfa_acoustic_corpus", "ls_1089-134686-0000"):
        parts += [load_audio(speech_dir / rows[clip]["file"]), np.zeros(SAMPLE_RATE, np.float32)]
        texts.append(rows[clip]["reference"])
    return np.concatenate(parts), " ".join(texts)


def test_held_end_of_text_saves_a_window_and_no_words(int8_model, four_clips):
    audio, reference = four_clips
    held = transcribe_batched(int8_model, audio)
    free = transcribe_batched(int8_model, audio, hold_end=False)
    assert held["batched"]["windows"] < free["batched"]["windows"]
    assert word_errors(reference, held["text"])[0] <= word_errors(reference, free["text"])[0]
    times = [(s["start"], s["end"]) for s in held["segments"]]
    assert all(0 <= a <= b <= len(audio) / SAMPLE_RATE for a, b in times)
    assert times == sorted(times)
