"""Number-by-number parity with the reference implementation (openai-whisper, test-only) on the same weights.

Weights: tiny.en from the embedded CTranslate2 files, exported by our converter to an OpenAI .pt that the
reference loads. Audio: the real clips of ../shared/data/speech, decoded once by us and fed to both engines
as the same float32 array (the reference would need a system ffmpeg to read files).

The default run covers: encoder and first-step logits, greedy tokens on single windows, long-form
transcription over several windows (greedy and beam 5: moving between windows, the previous text as
prompt), a temperature fallback that samples (seeded: the same draws as the reference), and the
transcribe options. ``-m slow`` runs the same comparisons over every English file.
"""

from __future__ import annotations

import pytest
import torch

import whisperkv
from whisperkv.audio import N_FRAMES, N_SAMPLES, SAMPLE_RATE, log_mel_spectrogram, pad_or_trim
from whisperkv.decoding.options import DecodingOptions

from .conftest import SPEECH_DIR, clip_path, english_clips, require_oracle, speech_manifest

pytestmark = pytest.mark.oracle
whisper = require_oracle("whisper")

QUICK = [
    "jfk",
    "ls_1089-134686-0000",
    "lj_LJ001-0001",
    "cv_22058267_en",
    "mfa_acoustic_corpus",
    "timit_LDC93S1",
]


def _first_window(audio):
    mel = log_mel_spectrogram(audio, 80, padding=N_SAMPLES)
    frames = mel.shape[-1] - N_FRAMES
    return pad_or_trim(mel[:, :frames], N_FRAMES)


def _clips(ids=None):
    rows = english_clips()
    if not rows:
        pytest.skip("speech set not found")
    return [r for r in rows if ids is None or r["id"] in ids]


def _margin_report(reference_model, mel, ours, theirs) -> str:
    """Where two greedy sequences part, and the reference's top-2 logit margin there."""
    step = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    tokenizer = whisper.tokenizer.get_tokenizer(False)
    prefix = list(tokenizer.sot_sequence_including_notimestamps) + theirs[:step]
    with torch.no_grad():
        logits = reference_model.logits(torch.tensor([prefix]), reference_model.encoder(mel[None]))[0, -1]
    top = logits.topk(2)
    margin = float(top.values[0] - top.values[1])
    ours_tok, ref_tok = ours[step : step + 1], theirs[step : step + 1]
    return f"first differing step {step}: ours {ours_tok} ref {ref_tok}, reference margin {margin:.4f}"


def test_encoder_and_first_step_logits_match(tiny_model, reference_model, speech_dir):
    for row in _clips(QUICK[:3]):
        audio = whisperkv.load_audio(clip_path(row))
        mel = _first_window(audio)[None]
        with torch.no_grad():
            ours = tiny_model.embed_audio(mel)
            theirs = reference_model.encoder(mel)
            enc_diff = float((ours - theirs).abs().max())
            tokens = torch.tensor([[50257, 50362]])
            cache = tiny_model.decoder.new_cache(
                tiny_model.decoder.project_cross_kv(ours, tiny_model.encoder_provenance(mel))
            )
            our_logits = tiny_model.decoder(tokens, cache)
            ref_logits = reference_model.logits(tokens, theirs)
        logit_diff = float((our_logits - ref_logits).abs().max())
        assert enc_diff <= 1e-3, f"{row['id']}: encoder max abs diff {enc_diff}"
        assert logit_diff <= 1e-3, f"{row['id']}: first-step logits max abs diff {logit_diff}"


def _greedy_parity(tiny_model, reference_model, rows):
    failures = []
    for row in rows:
        audio = whisperkv.load_audio(clip_path(row))
        mel = _first_window(audio)
        ours = whisperkv.decode(
            tiny_model, mel, DecodingOptions(language="en", without_timestamps=True)
        ).tokens
        theirs = whisper.decode(
            reference_model, mel, whisper.DecodingOptions(language="en", without_timestamps=True, fp16=False)
        ).tokens
        if ours != theirs:
            failures.append(f"{row['id']}: {_margin_report(reference_model, mel, ours, theirs)}")
    assert not failures, "\n".join(failures)


def test_greedy_tokens_identical_quick(tiny_model, reference_model, speech_dir):
    _greedy_parity(tiny_model, reference_model, _clips(QUICK[:3]))


@pytest.mark.slow
def test_greedy_tokens_identical_every_english_clip(tiny_model, reference_model, speech_dir):
    _greedy_parity(tiny_model, reference_model, _clips())


def _compare_transcripts(tiny_model, reference_model, name: str, audio, **options) -> tuple[dict, str | None]:
    """Both engines' transcribe() from the same random-number state; a description of any difference."""
    torch.manual_seed(0)  # a fallback to temperature > 0 samples: same seed, same draws
    ours = tiny_model.transcribe(audio, **options)
    torch.manual_seed(0)
    theirs = reference_model.transcribe(audio, fp16=False, **options)
    fields = ("seek", "start", "end", "text", "tokens", "temperature")
    a = [tuple(s[f] for f in fields) for s in ours["segments"]]
    b = [tuple(s[f] for f in fields) for s in theirs["segments"]]
    if a != b or ours["text"] != theirs["text"]:
        return ours, f"{name}:\n  ours {a}\n  ref  {b}"
    return ours, None


def _transcribe_parity(tiny_model, reference_model, rows, **options):
    failures = []
    for row in rows:
        audio = whisperkv.load_audio(clip_path(row))
        _, failure = _compare_transcripts(tiny_model, reference_model, row["id"], audio, **options)
        if failure:
            failures.append(failure)
    assert not failures, "\n".join(failures)


def test_transcribe_segments_identical_quick(tiny_model, reference_model, speech_dir):
    _transcribe_parity(tiny_model, reference_model, _clips(["ls_1089-134686-0000"]))


LONG_FILE = "long/lj001_0001-0032_concat.flac"


@pytest.fixture(scope="module")
def long_file(speech_dir):
    return whisperkv.load_audio(SPEECH_DIR / LONG_FILE)


@pytest.mark.parametrize(
    "seconds, min_windows, options",
    # 70 s: four windows (seek 0, 28.5, 52.7, 66.7 s); beam 5 on 40 s (two windows), for a short default run
    [(70, 4, {}), (40, 2, {"beam_size": 5})],
    ids=["greedy", "beam5"],
)
def test_multi_window_transcription_identical(
    tiny_model, reference_model, long_file, seconds, min_windows, options
):
    """The opening of a long-form file: windows follow each other at the last timestamp, each prompted
    with the text before it."""
    audio = long_file[: seconds * SAMPLE_RATE]
    ours, failure = _compare_transcripts(tiny_model, reference_model, LONG_FILE, audio, **options)
    assert failure is None, failure
    windows = sorted({s["seek"] for s in ours["segments"]})
    assert len(windows) >= min_windows, windows
    assert ours["segments"][-1]["end"] > seconds - 10


def test_fallback_to_a_higher_temperature_draws_what_the_reference_draws(
    tiny_model, reference_model, speech_dir
):
    """The greedy result fails a log-probability threshold no decode reaches (0.0), so the window is
    retried at 0.8 with 5 samples, through the real fallback code; seeded, ours draws the reference's
    samples. (None of the clips needs a fallback with its default thresholds.)"""
    audio = whisperkv.load_audio(SPEECH_DIR / "en" / "jfk.flac")
    options = {"temperature": (0.0, 0.8), "logprob_threshold": 0.0, "best_of": 5}
    ours, failure = _compare_transcripts(tiny_model, reference_model, "jfk", audio, **options)
    assert failure is None, failure
    assert ours["segments"] and all(s["temperature"] == 0.8 for s in ours["segments"])
    torch.manual_seed(1)  # and the draws decide the text: another seed samples another transcript
    other = tiny_model.transcribe(audio, **options)
    assert [s["tokens"] for s in other["segments"]] != [s["tokens"] for s in ours["segments"]]


def _all_english_files():
    rows = [r for r in speech_manifest() if r["language"] == "en"]  # the long-form files included
    if not rows:
        pytest.skip("speech set not found")
    return rows


@pytest.mark.slow
def test_transcribe_identical_on_every_english_file(tiny_model, reference_model, speech_dir):
    _transcribe_parity(tiny_model, reference_model, _all_english_files())


@pytest.mark.slow
def test_transcribe_beam5_identical_on_every_english_file(tiny_model, reference_model, speech_dir):
    _transcribe_parity(tiny_model, reference_model, _all_english_files(), beam_size=5)


@pytest.mark.parametrize(
    "options",
    [
        {"initial_prompt": "President Kennedy's inaugural address, 1961."},
        {"clip_timestamps": "0,4.5,5,11"},
        {"condition_on_previous_text": False, "prefix": "And so my"},
        {"without_timestamps": True},
    ],
    ids=["initial_prompt", "clip_timestamps", "prefix", "without_timestamps"],
)
def test_transcribe_options_identical(tiny_model, reference_model, speech_dir, options):
    _transcribe_parity(tiny_model, reference_model, _clips(["jfk"]), **options)
