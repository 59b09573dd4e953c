"""The streaming policy without a model: LocalAgreement-2, the session's events, PCM input."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tests.conftest import torch_threads
from whisperkv.stream.agreement import CONFIDENT_MARGIN_S, SURE_BEFORE_CUT, LocalAgreement, skip_start
from whisperkv.stream.clock import SimulatedClock
from whisperkv.stream.events import Word
from whisperkv.stream.hypothesis import Hypothesis, hypothesis_from_segments
from whisperkv.stream.pcm import PCMError, Resampler, pcm16_to_float
from whisperkv.stream.runner import run_stream
from whisperkv.stream.session import StreamingSession
from whisperkv.stream.sources import PCMPipe

SR = 16000


def words(text: str, start: float = 0.0, step: float = 0.5) -> list[Word]:
    return [Word(" " + w, start + i * step, start + i * step + 0.4) for i, w in enumerate(text.split())]


def test_agreement_commits_the_common_prefix_and_never_retracts():
    la = LocalAgreement()
    assert la.update(words("the cat sat")) == []  # one hypothesis: nothing agreed yet
    committed = la.update(words("the cat sat on"))
    assert [w.text for w in committed] == [" the", " cat", " sat"]
    # an earlier word now heard differently is not taken back; the agreed new word is committed
    assert [w.text for w in la.update(words("the dog sat on the mat"))] == [" on"]
    assert la.committed_text() == "the cat sat on"
    assert [w.text for w in la.update(words("the cat sat on the rug"))] == [" the"]
    # committed words repeated at the seam (times shifted) are not committed twice
    assert [w.text for w in la.update(words("on the rug", start=2.4))] == [" rug"]
    assert la.flush() == []
    assert la.committed_text() == "the cat sat on the rug"


def test_agreement_compares_normalised_words():
    la = LocalAgreement()
    la.update(words("Hello, world"))
    assert [w.text for w in la.update(words("hello world again"))] == [" hello", " world"]


def sure(text: str, probabilities: list[float], start: float = 0.0) -> list[Word]:
    """``words`` with the model's probability of each."""
    return [Word(w.text, w.start, w.end, p) for w, p in zip(words(text, start), probabilities)]


def test_a_confident_word_is_committed_at_its_first_hearing_and_only_then():
    # words end at 0.4, 0.9, 1.4 and 1.9 s; the audio heard ends at 2.0 s
    off = LocalAgreement()
    assert off.update(sure("the cat sat on", [0.99] * 4), heard_end=2.0) == []  # off by default
    la = LocalAgreement(confident=0.6)
    # "sat" is unsure, so neither it nor the sure word after it is final yet; "on" is the last word heard
    # (nothing follows it to settle its punctuation)
    committed = la.update(sure("the cat sat on", [0.9, 0.7, 0.4, 0.99]), heard_end=2.0)
    assert [w.text for w in committed] == [" the", " cat"]
    assert [w.text for w in la.previous] == [" sat", " on"]
    assert (la.final, la.settled) == (2, 0)  # final, but not heard twice: no cut after them yet
    # the next hearing agrees on "sat on" (LocalAgreement-2), and "the" is sure and ends in time
    committed = la.update(sure("the cat sat on the mat", [0.9, 0.9, 0.5, 0.9, 0.8, 0.99]), heard_end=3.0)
    assert [w.text for w in committed] == [" sat", " on", " the"]
    assert (la.final, la.settled) == (5, 4)  # "the cat" heard again, "sat on" agreed; "the" heard once
    assert la.committed_text() == "the cat sat on the"
    # without the audio's end (a caller that does not say) only what two hearings agree on
    committed = la.update(sure("the cat sat on the mat and", [0.99] * 7))
    assert [w.text for w in committed] == [" mat"]


def test_a_confident_word_ending_within_the_margin_of_the_audio_heard_waits():
    """A sure word with a word after it heard is final at its first hearing only if it ends at least
    ``CONFIDENT_MARGIN_S`` before the audio decoded: nearer the end it may still be being said."""
    cat = [Word(" the", 0.0, 0.4, 0.9), Word(" cat", 0.5, 0.9, 0.9), Word(" sat", 0.6, 0.7, 0.9)]
    got = LocalAgreement(confident=0.5).update(cat, heard_end=0.9 + CONFIDENT_MARGIN_S - 0.01)
    assert [w.text for w in got] == [" the"]  # "sat" (dated inside "cat") is heard whole; "cat" is not
    got = LocalAgreement(confident=0.5).update(cat, heard_end=0.9 + CONFIDENT_MARGIN_S)
    assert [w.text for w in got] == [" the", " cat"]


def test_a_word_before_one_that_reaches_the_audios_end_needs_to_be_surer():
    """Where the word after a sure word reaches the end of the audio heard (cut off, perhaps), the word
    is final at its first hearing only at ``SURE_BEFORE_CUT``: 1 s of "comparatively" was heard as
    "compared to...", and "compared" (0.69) committed; "began a confused" as "began to confuse.", and
    "to" (0.61) committed."""
    sat_end = words("the cat sat")[2].end  # 1.4 s: "the" 0-0.4, "cat" 0.5-0.9, "sat" 1.0-1.4
    cut_off = sat_end + CONFIDENT_MARGIN_S - 0.01  # "sat" reaches the end of what was heard
    got = LocalAgreement(confident=0.5).update(sure("the cat sat", [0.9, 0.7, 0.9]), heard_end=cut_off)
    assert [w.text for w in got] == [" the"]  # "cat" at 0.7 waits
    surer = sure("the cat sat", [0.9, SURE_BEFORE_CUT, 0.9])
    assert [w.text for w in LocalAgreement(confident=0.5).update(surer, heard_end=cut_off)] == [
        " the",
        " cat",
    ]
    # "sat" heard whole: 0.7 is enough for "cat", as the confident threshold says
    got = LocalAgreement(confident=0.5).update(sure("the cat sat", [0.9, 0.7, 0.9]), heard_end=sat_end + 0.1)
    assert [w.text for w in got] == [" the", " cat"]


def test_updates_that_commit_nothing_while_words_wait_are_counted():
    """``unagreed``: the session's sign of a stall (``STALL_UPDATES``), not of a slow clock (one
    disagreement between two hearings seconds apart)."""
    la = LocalAgreement()
    la.update(words("the cat sat"))
    assert la.unagreed == 1  # heard once: nothing to agree with yet
    for i, reading in enumerate(("dog", "cow", "hen")):  # "cat" read otherwise each time
        la.update(words(f"the {reading} sat"))
        assert (la.unagreed, la.committed_text()) == (i, "the"), i
    la.update(words("the hen sat on"))
    assert la.unagreed == 0 and la.committed_text() == "the hen sat"
    la.update([])
    assert la.unagreed == 0  # nothing pending: nothing waits


def test_confident_words_keep_their_probability_and_times_move_forward():
    la = LocalAgreement(confident=0.5)
    assert [w.text for w in la.update(sure("a b", [0.9, 0.9]), heard_end=5.0)] == [" a"]  # "b": last heard
    late = [Word(" b", 0.5, 0.9, 0.9), Word(" c", 0.7, 1.2, 0.9), Word(" d", 1.5, 1.9, 0.9)]
    b, c = la.update(la.committed + late, heard_end=5.0)  # "b" agreed; "c" (dated inside it) sure
    assert (c.text, c.start, c.probability) == (" c", 0.9, 0.9) and b.probability == 0.9


def test_a_word_is_as_sure_as_its_punctuation():
    """A stream's words carry the timing's ``probability_with_marks`` (the word's or its punctuation's,
    the lower), so ``--confident`` does not commit "forced," at its first hearing when the comma is
    unsure; a segment without it (not asked for) gives the word's own."""
    said = [
        {"word": " forced,", "start": 0.0, "end": 0.4, "probability": 0.88, "probability_with_marks": 0.29},
        {"word": " aligner", "start": 0.5, "end": 0.9, "probability": 0.74, "probability_with_marks": 0.74},
        {"word": " now", "start": 1.0, "end": 1.4, "probability": 0.9},
    ]
    heard = hypothesis_from_segments([{"end": 1.5, "words": said}], closed=1)
    assert [w.probability for w in heard.words] == [0.29, 0.74, 0.9]
    la = LocalAgreement(confident=0.5)
    assert la.update(heard.words, heard_end=3.0) == []  # "forced," waits, and so do the words after it


def test_a_confident_word_that_repeats_the_one_before_it_waits_for_a_second_hearing():
    """Repeats are where the model loops: "word. Word. Word." each final at its first hearing became a
    prompt of repeats, and the next utterance of mfa_words was heard as six "Word."s: eleven in all where
    the clip has seven."""
    la = LocalAgreement(confident=0.5)
    committed = la.update(sure("more word word word now", [0.99] * 5), heard_end=5.0)
    assert [w.text for w in committed] == [" more", " word"]  # the second "word" repeats the first
    la = LocalAgreement(confident=0.5)
    la.flush(sure("word", [0.99]))
    # the first "word" heard is the committed one again; the second repeats it
    assert la.update(sure("word word then", [0.99] * 3, start=2.0), heard_end=5.0) == []


def test_a_confident_word_waits_for_a_word_after_it():
    """The last word heard is not final at its first hearing, however sure and however long ago it
    ended: what follows decides its punctuation ("country" or "country."), and a run the model invents
    at the end of the audio would otherwise be committed word by word."""
    la = LocalAgreement(confident=0.5)
    assert la.update(sure("ask not", [0.99, 0.99]), heard_end=5.0) == [la.committed[0]]
    assert la.committed_text() == "ask" and [w.text for w in la.previous] == [" not"]
    assert [w.text for w in la.update(sure("ask not what", [0.99] * 3), heard_end=6.0)] == [" not"]


def test_words_two_hearings_read_differently_need_a_third():
    """lj001: "the one the whole" heard, then "they'll want the whole" twice — LocalAgreement-2 committed
    that guess, and every later hearing said "though on the whole". Where a hearing reads whole words
    of the one before it differently, between words the two share, those words need three hearings."""
    la = LocalAgreement()
    la.update(words("but the one the whole"))
    assert [w.text for w in la.update(words("but they'll want the whole accepted"))] == [" but"]
    assert la.update(words("but they'll want the whole except in")) == []  # two hearings of a guess
    assert la.update(words("but though on the whole except in italy")) == []  # read anew: contested
    assert la.update(words("but though on the whole except in italy")) == []
    committed = la.update(words("but though on the whole except in italy gothic"))
    assert la.committed_text() == "but though on the whole except in italy"
    assert [w.text for w in committed][:2] == [" though", " on"]
    assert (la.settled, la.final) == (8, 8)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("the tilage of thy husbandry", "the tillage of thy husbandry"),  # one word spelt another way
        ("here's a long pause", "here's long pause and"),  # one reading has a word more
        ("his tender", "his tender air might bear"),  # the first reading ended there: less audio
    ],
)
def test_hearings_that_part_without_two_readings_need_two(first: str, second: str):
    la = LocalAgreement()
    la.update(words(first))
    la.update(words(second))
    la.update(words(second + " his memory"))  # the second reading heard again: final
    assert la.committed_text() == second


def test_a_committed_word_heard_later_as_a_longer_word_is_lengthened_not_lost():
    """lj002-0020 (1.5 s): " in" " 18" " third." at 1 s committed "in 18" ("18" sure, a word after it);
    the close heard " in" " 1813." — counted as a re-hearing of "18", "13" was lost. The longer word's
    end is committed as the end of the committed word: the text only grows, "in 18" then "in 1813."."""
    la = LocalAgreement(confident=0.5)
    first = [Word(" in", 0.0, 0.28, 0.9), Word(" 18", 0.28, 0.64, 0.81), Word(" third.", 0.64, 0.9, 0.3)]
    assert [w.text for w in la.update(first, heard_end=1.0)] == [" in", " 18"]
    added = la.flush([Word(" in", 0.0, 0.28, 0.9), Word(" 1813.", 0.3, 1.1, 0.8)])
    assert [w.text for w in added] == ["13."] and added[0].start == 0.64
    assert la.committed_text() == "in 1813." and [w.text for w in la.committed] == [" in", " 1813."]
    # the lengthened word is what later hearings are aligned with: nothing of it is committed again
    assert [
        w.text for w in la.flush([Word(" in", 0.0, 0.3), Word(" 1813.", 0.3, 1.1), *words("ok", 1.2)])
    ] == [" ok"]


@pytest.mark.parametrize(
    ("committed", "heard"),
    [
        (" country.", " country.."),  # the committed word ends in punctuation: heard whole
        (" country", " country."),  # only punctuation added
    ],
)
def test_a_longer_word_that_is_not_the_committed_one_heard_whole_adds_nothing(committed: str, heard: str):
    la = LocalAgreement()
    la.flush([Word(" in", 0.0, 0.28), Word(committed, 0.28, 0.64)])
    assert la.flush([Word(" in", 0.0, 0.28), Word(heard, 0.3, 1.1)]) == []
    assert la.committed_text() == "in" + committed


class ScriptedDecoder:
    """Hypotheses given in advance, one per decode; records what each decode was asked."""

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.calls: list[tuple[int, int, str]] = []

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str) -> Hypothesis:
        self.calls.append((start_sample, len(audio), prompt))
        text = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        ws = words(text, start=0.1, step=0.4)
        return Hypothesis(ws, [ws[1].end] if len(ws) > 2 else [])

    def reuse_summary(self) -> dict:
        return {"type": "reuse"}


class Silence:
    def __init__(self, seconds: float) -> None:
        self.left = int(seconds * SR)

    def read(self, n: int) -> np.ndarray:
        n = min(n, self.left)
        self.left -= n
        return np.zeros(n, dtype=np.float32)


def test_session_events_in_order_and_commits_only_grow():
    decoder = ScriptedDecoder(["a", "a b", "a b c", "a b c d", "a b c d e"])
    session = StreamingSession(decoder, trim_after=100)
    events = list(run_stream(Silence(6.0), session, SimulatedClock(fixed_cost=0.25), chunk=1.0))
    times = [e.audio_time for e in events]
    assert times == sorted(times) and times[0] >= 1.0
    commits = [e for e in events if e.type == "commit"]
    text = " ".join(e.text for e in commits)
    assert text == "a b c d e"  # agreed words, then the end of input flushed the rest
    assert all(b.start >= a.end - 1e-9 for a, b in zip(commits, commits[1:]))
    assert [e.type for e in events][-1] == "utterance_end"
    # the clock is computation-aware: each update starts when a chunk has arrived, emits 0.25 s later
    assert times[0] == pytest.approx(1.25)


def test_a_fixed_cost_is_charged_to_updates_not_to_the_feeds_between_them():
    """``--simulate_compute`` is a cost per update: the feeds between updates (the VAD hearing new audio)
    cost nothing unless they decoded; the measured clock counts every span."""
    clock = SimulatedClock(fixed_cost=0.5)
    with clock.computing() as span:
        span.update = False
    assert clock.now == 0.0
    with clock.computing():
        pass
    assert clock.now == 0.5
    measured = SimulatedClock()
    with measured.computing() as span:
        span.update = False
        sum(range(100_000))
    assert measured.now == measured.compute > 0


NAN = float("nan")


@pytest.mark.parametrize("chunk, listen", [(0.0, 0.25), (NAN, 0.25), (1.0, 0.0), (1.0, NAN)])
def test_a_chunk_or_listening_step_not_above_zero_is_refused(chunk, listen):
    session = StreamingSession(ScriptedDecoder(["a"]))
    with pytest.raises(ValueError, match="must be above 0 s"):
        next(run_stream(Silence(1.0), session, SimulatedClock(0.0), chunk, listen=listen))


def test_session_trims_at_a_committed_segment_end_and_prompts_with_what_left_the_buffer():
    decoder = ScriptedDecoder(["one two three"] * 3)
    session = StreamingSession(decoder, trim_after=0.5, min_audio_s=0.1)
    list(run_stream(Silence(4.0), session, SimulatedClock(fixed_cost=0.0), chunk=1.0))
    starts = [c[0] for c in decoder.calls]
    assert starts[0] == 0 and max(starts) > 0  # the buffer moved forward after "one two" was committed
    moved = [c for c in decoder.calls if c[0] > 0]
    assert moved[0][2] == "one two"  # committed text no longer in the buffer is the prompt


class DeafAfterSpeech:
    """A decoder that hears the words of ``SAID`` inside the audio it is given, but not the whispered ones
    (2-3 s) when its audio also holds the loud "a b" before them: as tiny.en, prompted, once heard a
    whispered sentence as nothing."""

    SAID = [(" a", 0.1, 0.5), (" b", 0.6, 0.9), (" c", 2.0, 2.4), (" d.", 2.5, 2.9)]
    SAID += [(" e", 5.0, 5.4), (" f", 5.5, 5.9), (" g", 6.0, 6.4)]

    def __init__(self) -> None:
        self.calls: list[tuple[float, float, str]] = []

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str) -> Hypothesis:
        start, end = start_sample / SR, (start_sample + len(audio)) / SR
        self.calls.append((start, end, prompt))
        deaf = start < 0.9
        heard = [
            Word(text, a - start, b - start, 0.9)
            for text, a, b in self.SAID
            if start <= a and b <= end and not (deaf and 2.0 <= a < 3.0)
        ]
        return Hypothesis(heard, [])

    def reuse_summary(self) -> dict:
        return {"type": "reuse"}


def test_without_a_vad_a_long_stretch_with_no_word_is_heard_alone_before_the_words_after_it():
    decoder = DeafAfterSpeech()
    session = StreamingSession(decoder, trim_after=100)
    list(run_stream(Silence(8.0), session, SimulatedClock(fixed_cost=0.0), chunk=1.0))
    assert session.committed_text() == "a b c d. e f g"  # was "a b e f g": the buffer went past c d.
    gap = [call for call in decoder.calls if call[0] == pytest.approx(0.9)]
    assert gap == [(pytest.approx(0.9), pytest.approx(5.0), "")]  # once, alone, up to "e"
    later = [call for call in decoder.calls if call[0] > 0.9]
    assert later and all(call[0] == pytest.approx(2.9) and call[2] == "a b c d." for call in later)


def test_a_stretch_heard_alone_that_holds_no_words_changes_nothing():
    decoder = DeafAfterSpeech()
    decoder.SAID = [w for w in DeafAfterSpeech.SAID if not 2.0 <= w[1] < 3.0]  # a silent stretch
    session = StreamingSession(decoder, trim_after=100)
    list(run_stream(Silence(8.0), session, SimulatedClock(fixed_cost=0.0), chunk=1.0))
    assert session.committed_text() == "a b e f g"
    assert sum(call[0] == pytest.approx(0.9) for call in decoder.calls) == 1


class Rehearing:
    """Hears the words of ``SAID`` inside the audio it is given; the last one right ("five") only when
    its audio starts at the utterance's start (as tiny.en heard "1455" where a cut buffer heard "14-55"),
    and, with ``whole_stops_early``, that whole hearing stops before it (as one of mfa_cold_corpus
    stopped before "Great, thanks.")."""

    SAID = [
        (" one", 0.1, 0.5),
        (" two", 0.6, 1.0),
        (" three", 1.1, 1.5),
        (" four", 1.6, 2.0),
        (" five", 4.1, 4.5),
    ]

    def __init__(self, whole_stops_early: bool = False) -> None:
        self.whole_stops_early = whole_stops_early
        self.calls: list[tuple[float, float, str]] = []

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str) -> Hypothesis:
        start, end = start_sample / SR, (start_sample + len(audio)) / SR
        self.calls.append((start, end, prompt))
        whole = start == 0
        heard = [
            Word(text if whole or text != " five" else " fife", a - start, b - start, 0.9)
            for text, a, b in self.SAID
            if start <= a and b <= end and not (whole and self.whole_stops_early and text == " five")
        ]
        return Hypothesis(heard, [w.end for w in heard])

    def reuse_summary(self) -> dict:
        return {"type": "reuse"}


@pytest.mark.parametrize(
    ("stops_early", "text"), [(False, "one two three four five"), (True, "one two three four fife")]
)
def test_an_utterance_is_closed_by_a_hearing_of_all_its_audio_unless_that_stops_early(stops_early, text):
    decoder = Rehearing(whole_stops_early=stops_early)
    session = StreamingSession(decoder, trim_after=0.5, min_audio_s=0.1)
    events = list(run_stream(Silence(5.0), session, SimulatedClock(fixed_cost=0.0), chunk=1.0))
    assert any(start > 0 for start, _, _ in decoder.calls)  # the buffer was cut while the words came
    assert session.committed_text() == text
    assert [e.text for e in events if e.type == "utterance_end"] == [text]
    closing = decoder.calls[-2:] if stops_early else decoder.calls[-1:]
    assert closing[0][:2] == (0.0, 5.0) and closing[0][2] == ""  # all the utterance, nothing as prompt
    if stops_early:
        assert closing[1][0] > 0  # then the buffer, as before


def test_audio_cleared_is_not_heard_by_the_close():
    decoder = Rehearing()
    session = StreamingSession(decoder, min_audio_s=0.1)
    session.feed(np.zeros(2 * SR, dtype=np.float32))
    session.update()
    session.clear()
    session.feed(np.zeros(SR, dtype=np.float32))
    session.commit()
    assert decoder.calls[-1][:2] == (2.0, 3.0)


def test_pcm_odd_byte_count_is_an_error():
    with pytest.raises(PCMError, match="odd number of bytes"):
        pcm16_to_float(b"\x00\x01\x02")
    assert pcm16_to_float(np.array([0, 16384, -32768], "<i2").tobytes()).tolist() == [0.0, 0.5, -1.0]


def test_pcm_pipe_reads_split_bytes_and_flags_a_stray_last_byte():
    data = np.arange(1000, dtype="<i2").tobytes() + b"\x07"
    pipe = PCMPipe(io.BufferedReader(io.BytesIO(data)))
    out = np.concatenate([pipe.read(300), pipe.read(300), pipe.read(300), pipe.read(300)])
    assert len(out) == 1000 and pipe.error is not None and "odd number of bytes" in pipe.error
    assert np.allclose(out * 32768, np.arange(1000))


def test_resampler_24k_keeps_a_tone_and_the_duration():
    t = np.arange(24000) / 24000
    tone = (0.5 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2").tobytes()
    resample = Resampler(24000)
    out = np.concatenate(
        [resample(tone[i : i + 4800]) for i in range(0, len(tone), 4800)] + [resample.flush()]
    )
    assert abs(len(out) - 16000) <= 32
    spectrum = np.abs(np.fft.rfft(out[:16000]))
    assert abs(int(np.argmax(spectrum)) * SR / 16000 - 440) <= 2


def test_vad_leaves_torch_threads_alone_and_hears_no_speech_in_silence():
    import torch

    from whisperkv.stream.vad import SpeechDetector

    with torch_threads(2):  # silero-vad's import would set it to 1
        detector = SpeechDetector()
        assert torch.get_num_threads() == 2
    assert detector.process(np.zeros(3 * SR, dtype=np.float32)) == []  # silence: no boundary


def test_a_stream_that_fell_behind_loses_no_audio_when_the_utterance_closes():
    decoder = ScriptedDecoder(["one two three four"])
    session = StreamingSession(decoder, trim_after=100, max_buffer=100)
    session.feed(np.zeros(75 * SR, dtype=np.float32))  # 75 s arrived while nothing was decoded
    events = session.finish()
    starts = [c[0] / SR for c in decoder.calls]
    assert starts[0] == 0 and starts[-1] >= 45  # every part of the 75 s was decoded, window by window
    assert all(c[1] <= 30 * SR for c in decoder.calls)
    commits = [e for e in events if e.type == "commit"]
    assert len(commits) >= 3 and all(b.start >= a.end for a, b in zip(commits, commits[1:]))


def test_agreement_commits_no_loop_heard_over_committed_audio():
    la = LocalAgreement()
    said = words("word word word word", step=0.3)  # said four times, committed
    la.update(said)
    la.update(said + words("here", start=1.2))
    assert la.committed_text() == "word word word word"
    # the model loops: eight "word"s squeezed into the same 1.2 s, then the next word
    looped = [Word(" word", 0.15 * i, 0.15 * i + 0.14) for i in range(8)] + words("here", start=1.2)
    assert [w.text for w in la.update(looped)] == [" here"]
    assert [w.text for w in la.update(looped)] == []
    assert la.committed_text() == "word word word word here"
    # and a word said again right after the committed ones is new
    assert [w.text for w in la.update(looped + words("word again", start=1.7))] == []
    assert [w.text for w in la.update(looped + words("word again now", start=1.7))] == [" word", " again"]


class LoopingDecoder(ScriptedDecoder):
    """A scripted decoder whose decodes from the ``loop_from``-th on fail Whisper's repetition check."""

    def __init__(self, script: list[str], loop_from: int) -> None:
        super().__init__(script)
        self.loop_from = loop_from

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str) -> Hypothesis:
        hypothesis = super().decode(audio, start_sample, prompt)
        hypothesis.repetitive = len(self.calls) >= self.loop_from
        return hypothesis


def test_a_looping_decode_is_neither_agreed_with_nor_committed_at_the_close():
    decoder = LoopingDecoder(["a b", "a b c", "a b c word word word word word word word"], loop_from=3)
    session = StreamingSession(decoder, trim_after=100)
    session.feed(np.zeros(2 * SR, dtype=np.float32))
    session.update()
    session.feed(np.zeros(SR, dtype=np.float32))
    assert [e.text for e in session.update() if e.type == "commit"] == ["a b"]
    session.feed(np.zeros(SR, dtype=np.float32))
    assert session.update() == []  # the loop: nothing agreed, the last hypothesis kept
    session.finish()  # decoded as a loop again: what the last good update heard is committed
    assert session.committed_text() == "a b c"


class PromptLoopDecoder:
    """mfa_words' last utterance: 1 s saying "word" once, after a committed "... more word word word".
    Prompted with that, it closes as five "word"s, four of them 0 s long (what tiny.en heard at 0.5 s an
    update); heard without a prompt, as one."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str) -> Hypothesis:
        self.calls.append((start_sample, prompt))
        if start_sample == 0:
            return Hypothesis(words("more word word word", start=0.1, step=0.3))  # ends at 1.4 s
        if not prompt:
            return Hypothesis([Word(" word", 0.0, 0.5, 0.8)])
        stacked = [Word(" word", 0.58, 0.58, 0.0)] + [Word(" word", 0.96, 0.96, 0.9)] * 3
        return Hypothesis([Word(" word", 0.0, 0.5, 0.69), *stacked])

    def reuse_summary(self) -> dict:
        return {"type": "reuse"}


def test_a_close_that_fails_whispers_hallucination_rule_is_heard_again_without_the_prompt():
    decoder = PromptLoopDecoder()
    session = StreamingSession(decoder)
    session.feed(np.zeros(3 * SR, dtype=np.float32))
    session.commit()  # the first utterance, heard without a prompt (nothing committed): kept as heard
    assert session.committed_text() == "more word word word" and len(decoder.calls) == 1
    session.feed(np.zeros(SR, dtype=np.float32))
    session.commit()
    assert decoder.calls[1:] == [(3 * SR, "more word word word"), (3 * SR, "")]
    assert session.committed_text() == "more word word word word"


def test_agreement_with_no_committed_word_in_the_buffer_skips_only_a_repeat_of_the_committed_end():
    la = LocalAgreement()
    la.flush(words("can do", start=0.0))  # committed; "do" dated 0.5-0.9
    la.first_in_buffer = len(la.committed)  # the buffer was cut after them: none of them is in it
    # "for" dated 0.1 s before the committed end is new all the same (by time alone it was skipped: lost)
    heard = [Word(" for", 0.75, 1.0), Word(" you", 1.1, 1.4)]
    assert [w.text for w in la.unseen(heard)] == [" for", " you"]
    # a repeat of the committed end near it is a re-hearing (the cut may leave a sliver of "do")
    assert [w.text for w in la.unseen([Word(" do", 0.7, 0.9), *heard])] == [" for", " you"]
    # unless the session knows the buffer holds nothing committed (a new utterance after a pause)
    la.fresh = True
    assert [w.text for w in la.unseen([Word(" do", 1.5, 1.8)])] == [" do"]


class UnclosedDecoder(ScriptedDecoder):
    """Hypotheses that close no segment (a decode that ran on without a timestamp)."""

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str) -> Hypothesis:
        self.calls.append((start_sample, len(audio), prompt))
        return Hypothesis(words("one two. three four five six", start=0.1, step=0.6), [])


def test_a_long_buffer_with_no_segment_end_is_cut_at_a_committed_sentence_end():
    decoder = UnclosedDecoder(["-"])
    session = StreamingSession(decoder, trim_after=2.0, max_buffer=100)
    for _ in range(4):
        session.feed(np.zeros(SR, dtype=np.float32))
        session.update()
        if session.buffer_start:
            break
    assert session.committed_text().startswith("one two.")
    cut = session.buffer_start / SR
    assert 1.1 <= cut <= 1.3  # after "two." (0.7-1.1), before "three" (1.3)
    session.feed(np.zeros(SR, dtype=np.float32))
    session.update()  # the next decode starts at the cut, prompted with what left the buffer
    assert decoder.calls[-1][0] == int(cut * SR) and decoder.calls[-1][2] == "one two."


class SteadyDecoder(ScriptedDecoder):
    """A steady talker, each word sure (0.99): a word every 0.5 s of the stream, those wholly in the
    buffer, no segment or sentence end (so only ``max_buffer``'s forced cut moves the buffer)."""

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str) -> Hypothesis:
        self.calls.append((start_sample, len(audio), prompt))
        start, end = start_sample / SR, (start_sample + len(audio)) / SR
        spoken = [(f" w{i}", 0.5 * i, 0.5 * i + 0.4) for i in range(200)]
        heard = [Word(t, s - start, e - start, 0.99) for t, s, e in spoken if start <= s and e <= end]
        return Hypothesis(heard, [])


def test_a_forced_cut_falls_after_words_heard_twice_and_carries_the_confident_ones():
    """Past ``max_buffer`` the buffer is cut at the end of the last word heard twice: a word final at its
    first hearing (``confident``) may end where the next word's start is least sure, so it stays in the
    buffer, carried, until heard again. Every word is committed once, in order."""
    decoder = SteadyDecoder(["-"])
    session = StreamingSession(decoder, trim_after=100, max_buffer=3.0, confident=0.5)
    cuts = []
    for _ in range(8):  # two words a second: one ends 0.6 s before the audio heard (sure at once), one not
        session.feed(np.zeros(SR, dtype=np.float32))
        session.update()
        agreement = session.agreement
        if not cuts or session.buffer_start != cuts[-1][0]:
            cuts.append((session.buffer_start, agreement.settled_end))
    forced = [(start, end) for start, end in cuts if start > 0]
    assert forced, "the buffer was never cut"
    assert all(start / SR <= end for start, end in forced)  # never after a word heard only once
    texts = [w.text.strip() for w in session.agreement.committed]
    assert texts == [f"w{i}" for i in range(len(texts))] and len(texts) >= 12


#: two hearings of the utterances file without a VAD at 3 s per update (int8, Zen 4), from a buffer starting
#: at 93.08 s: "For" dated into "She had your dark suit in greasy wash for all year." (104.4-108.9 s), which
#: they skipped, "although" stretched over the rest of it
FAR_HEARING = [
    ("And", 100.72, 101.06), ("I", 101.06, 101.14), ("should", 101.14, 101.24), ("be", 101.24, 101.34),
    ("all", 101.34, 101.66), ("thanks.", 101.66, 103.08), ("For", 106.86, 107.68),
    ("although", 107.68, 110.74), ("the", 110.74, 111.02), ("Chinese", 111.02, 111.46),
]  # fmt: skip


def test_words_dated_into_the_speech_a_long_word_hides_are_held_with_it():
    """A long word's skip may begin before it: "For", heard after 3.8 s with no word and less than
    ``LONGEST_WORD_S`` before the stretched "although", is not committed on two hearings' word (committed, a
    nearer hearing took the skipped sentence's own "for" for it and lost "She had your dark suit in greasy
    wash"); the buffer is to be cut ``CONTEXT_S`` before it (``skip_from``). "although" 3 s shorter: "For"
    and the rest are committed."""
    heard = [Word(" " + t, s, e, 0.9) for t, s, e in FAR_HEARING]
    assert skip_start(heard, 7) == 6 and skip_start(heard, 5) == 5  # no stretch before "thanks."
    la = LocalAgreement()
    la.update(heard, heard_end=111.5)
    committed = la.update(heard, heard_end=113.0)
    assert [w.text.strip() for w in committed] == ["And", "I", "should", "be", "all", "thanks."]
    assert la.skipping is not None and la.skipping.text == " although" and la.skip_from == 106.86
    later = [Word(w.text, w.start, w.end - 3.0, w.probability) if w.text == " although" else w for w in heard]
    assert [w.text.strip() for w in committed_after_thanks(later)] == ["For", "although", "the", "Chinese"]


def committed_after_thanks(hypothesis: list[Word]) -> list[Word]:
    """What two hearings of ``hypothesis`` commit after "thanks." was committed (no long word: all)."""
    la = LocalAgreement()
    la.update(hypothesis[:6], heard_end=103.5)
    la.update(hypothesis[:6], heard_end=104.0)
    la.update(hypothesis, heard_end=111.5)
    return la.update(hypothesis, heard_end=113.0)
