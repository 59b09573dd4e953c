"""The real model streamed at simulated compute times: a stream that falls behind lags, never drops
(issue 42).

Each run feeds a clip on ``SimulatedClock(fixed_cost)``: every update costs ``compute`` seconds of stream
time, so at 1.5 s per 1 s chunk the stream falls behind and each update sees 1.5 s of new audio. The
committed text is compared with ``transcribe()`` of the same audio (greedy, the fallback schedule) on
normalised words (``whisperkv.metrics``' normaliser and jiwer's alignment):

* jfk: no word of the offline transcript missing, at every compute time, VAD on and off;
* the other clips: missing words (deletions) within ``DELETION_BUDGET`` of the offline words and the
  WER against offline within ``WER_BUDGET`` — the stream decodes other buffers than ``transcribe()``
  (its own 30 s windows, prompts and utterance ends), so a word may be heard differently, but not lost;
* every clip: against the fastest clock's committed text (0.1 s per update), no more than
  ``DELETION_BUDGET`` of its words missing at a slower one (0 on jfk).

The default run streams jfk at 1.5 s per update without a VAD (the issue's reproducer, which lost
"what you can do for your"); every compute time, the other clips and both long files are ``slow``, each
with LocalAgreement-2 alone and with ``--confident 0.5``.
"""

from __future__ import annotations

import jiwer
import numpy as np
import pytest

from whisperkv.audio import load_audio
from whisperkv.metrics import normalize_text, wer
from whisperkv.stream.clock import SimulatedClock
from whisperkv.stream.local_decoder import LocalDecoder
from whisperkv.stream.runner import run_stream
from whisperkv.stream.session import StreamingSession
from whisperkv.stream.vad import SpeechDetector, load_vad_model
from whisperkv.transcribe import transcribe

JFK = "en/jfk.flac"
COMPUTE_TIMES = (0.1, 0.5, 1.5, 3.0, 5.0)
#: missing words allowed on clips other than jfk, as a share of the reference's words
DELETION_BUDGET = 0.05
#: WER of the committed text against the offline transcript allowed on clips other than jfk
WER_BUDGET = 0.15
CLIPS = (
    "en/ls_1089-134686-0000.flac",
    "en/lj_LJ001-0001.flac",
    "en/ls_2412-153948-0000.flac",
    "en/mfa_words.flac",
    "en/pv_test_en.wav",
    "en/librivox_sas01_0870.wav",
)
LONG = ("long/lj001_0001-0032_concat.flac", "long/librivox_sonnets_001-003_concat.flac")
#: every sweep runs with LocalAgreement-2 alone and with ``--confident 0.5``
CONFIDENT = pytest.mark.parametrize("confident", [None, 0.5], ids=["agreement", "confident"])


class Samples:
    def __init__(self, audio: np.ndarray) -> None:
        self.audio, self.position = audio, 0

    def read(self, n: int) -> np.ndarray:
        out = self.audio[self.position : self.position + n]
        self.position += len(out)
        return out


@pytest.fixture(scope="module")
def runs(tiny_model, speech_dir):
    """``runs(clip, compute, vad, confident=None)`` → committed text; ``runs.offline(clip)`` →
    ``transcribe()``'s text."""
    audio, texts, vad_model = {}, {}, []

    def load(clip: str) -> np.ndarray:
        if clip not in audio:
            audio[clip] = load_audio(speech_dir / clip)
        return audio[clip]

    def stream(clip: str, compute: float, vad: bool, confident: float | None = None) -> str:
        key = (clip, compute, vad, confident)
        if key not in texts:
            if vad and not vad_model:
                vad_model.append(load_vad_model())
            detector = SpeechDetector(vad_model[0]) if vad else None
            session = StreamingSession(LocalDecoder(tiny_model), vad=detector, confident=confident)
            list(run_stream(Samples(load(clip)), session, SimulatedClock(compute), chunk=1.0))
            texts[key] = session.committed_text()
        return texts[key]

    def offline(clip: str) -> str:
        if clip not in texts:
            texts[clip] = transcribe(tiny_model, load(clip), language="en")["text"]
        return texts[clip]

    stream.offline = offline
    return stream


def alignment(reference: str, hypothesis: str):
    return jiwer.process_words(normalize_text(reference), normalize_text(hypothesis))


def test_jfk_at_one_and_a_half_seconds_per_update_loses_no_word(runs):
    offline, streamed = runs.offline(JFK), runs(JFK, 1.5, False)
    found = alignment(offline, streamed)
    assert found.deletions == 0, (offline, streamed)  # was: "... ask country." ("what you can do for your")
    assert normalize_text(streamed) == normalize_text(offline)


@pytest.mark.slow
@CONFIDENT
@pytest.mark.parametrize("vad", [False, True], ids=["no_vad", "vad"])
@pytest.mark.parametrize("compute", COMPUTE_TIMES)
def test_jfk_loses_no_word_at_any_compute_time(runs, compute, vad, confident):
    streamed = runs(JFK, compute, vad, confident)
    assert alignment(runs.offline(JFK), streamed).deletions == 0, streamed
    assert alignment(runs(JFK, COMPUTE_TIMES[0], vad, confident), streamed).deletions == 0, streamed


def test_jfk_with_confident_commits_loses_no_word(runs):
    """``--confident 0.5`` at 1.5 s per update (where LocalAgreement-2 once lost five words): the words
    of ``transcribe()``, none dropped."""
    streamed = runs(JFK, 1.5, False, 0.5)
    assert normalize_text(streamed) == normalize_text(runs.offline(JFK)), streamed


def check_within_budget(runs, clip: str, compute: float, vad: bool, confident: float | None = None) -> None:
    offline, streamed = runs.offline(clip), runs(clip, compute, vad, confident)
    words = len(normalize_text(offline).split())
    assert alignment(offline, streamed).deletions <= DELETION_BUDGET * words, (offline, streamed)
    assert wer(offline, streamed) <= WER_BUDGET, (offline, streamed)
    faster = runs(clip, COMPUTE_TIMES[0], vad, confident)
    assert alignment(faster, streamed).deletions <= DELETION_BUDGET * words, (faster, streamed)


@pytest.mark.slow
@CONFIDENT
@pytest.mark.parametrize("vad", [False, True], ids=["no_vad", "vad"])
@pytest.mark.parametrize("compute", COMPUTE_TIMES)
@pytest.mark.parametrize("clip", CLIPS)
def test_clips_lose_no_word_beyond_the_budget(runs, clip, compute, vad, confident, request):
    if clip == "en/mfa_words.flac" and vad:
        request.applymarker(
            pytest.mark.xfail(
                reason="offline transcribe() is the wrong yardstick here: it hears six 'word's at the "
                "end where the clip says five (manifest.tsv) and 'for Styliner' for 'forced aligner'; the "
                "stream with a VAD hears the clip's five at every compute time (the test below), so one "
                "offline word is 'missing', and at 0.1-0.5 s 'forced a liner' is 3 more errors",
                strict=True,
            )
        )
    check_within_budget(runs, clip, compute, vad, confident)


@pytest.mark.slow
@CONFIDENT
@pytest.mark.parametrize("vad", [False, True], ids=["no_vad", "vad"])
@pytest.mark.parametrize("compute", COMPUTE_TIMES)
@pytest.mark.parametrize("clip", LONG)
def test_long_files_lose_no_word_beyond_the_budget(runs, clip, compute, vad, confident):
    check_within_budget(runs, clip, compute, vad, confident)


@pytest.mark.slow
@CONFIDENT
@pytest.mark.parametrize("compute", COMPUTE_TIMES)
def test_mfa_words_with_vad_keeps_every_word_of_the_clip(runs, compute, confident, speech_dir):
    """Against the clip's own words (manifest.tsv): "word" said five times at the end, across two
    utterances the VAD cuts, is five "word"s at every compute time (two were lost at 1.5-5 s, two added at
    0.1-0.5 s: an identical word at the seam was taken for, or not taken for, a re-hearing)."""
    import csv

    rows = csv.DictReader(open(speech_dir / "manifest.tsv", encoding="utf-8"), delimiter="\t")
    reference = next(r["reference"] for r in rows if r["file"] == "en/mfa_words.flac")
    streamed = runs("en/mfa_words.flac", compute, True, confident)
    found = alignment(reference, streamed)
    assert found.deletions == 0, streamed
    assert normalize_text(streamed).split().count("word") == reference.split().count("word") == 7
