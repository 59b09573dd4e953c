"""Number-by-number parity with the reference implementation (openai-whisper, test-only) on the same weights.

Weights: tiny.en from the embedded CTranslate2 files, exported by our converter to an OpenAI .pt that the
reference loads. Audio: the real clips of ../shared/data/speech, decoded once by us and fed to both engines
as the same float32 array (the reference would need a system ffmpeg to read files).
"""

from __future__ import annotations

import pytest
import torch

import whisperkv
from whisperkv.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
from whisperkv.decoding.options import DecodingOptions

from .conftest import clip_path, english_clips, speech_manifest

pytestmark = pytest.mark.oracle
whisper = pytest.importorskip("whisper")

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
    for row in _clips(QUICK):
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
    _greedy_parity(tiny_model, reference_model, _clips(QUICK))


@pytest.mark.slow
def test_greedy_tokens_identical_every_english_clip(tiny_model, reference_model, speech_dir):
    _greedy_parity(tiny_model, reference_model, _clips())


def _transcribe_parity(tiny_model, reference_model, rows, **options):
    failures = []
    for row in rows:
        audio = whisperkv.load_audio(clip_path(row))
        torch.manual_seed(0)  # a fallback to temperature > 0 samples: same seed, same draws
        ours = tiny_model.transcribe(audio, **options)
        torch.manual_seed(0)
        theirs = reference_model.transcribe(audio, fp16=False, **options)
        a = [(s["start"], s["end"], s["text"], s["tokens"]) for s in ours["segments"]]
        b = [(s["start"], s["end"], s["text"], s["tokens"]) for s in theirs["segments"]]
        if a != b or ours["text"] != theirs["text"]:
            failures.append(f"{row['id']}:\n  ours {a}\n  ref  {b}")
    assert not failures, "\n".join(failures)


def test_transcribe_segments_identical_quick(tiny_model, reference_model, speech_dir):
    _transcribe_parity(tiny_model, reference_model, _clips(QUICK[:3]))


def test_transcribe_beam5_segments_identical_quick(tiny_model, reference_model, speech_dir):
    _transcribe_parity(tiny_model, reference_model, _clips(["lj_LJ001-0002"]), beam_size=5)


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
