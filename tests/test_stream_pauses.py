"""Words the VAD did not take for speech are still heard: each pause is decoded once, whole (issue 42).

silero-vad scored the whispered half of mfa_whisper2 ("... speech whatsoever here") at most 0.13 against
its 0.5 threshold, so that audio was never in an utterance's buffer and no update decoded it. A pause
holding a frame that came near speech (``MAYBE_SPEECH``) is now decoded when it is over — the next speech
starts, a window of it has passed, or input ends — and what it holds is committed like an utterance's
last hypothesis. A committed word that reaches into the pause is decoded again with it and recognised
as committed, not heard twice.

Without a model: ``TimelineDecoder`` (tests/test_stream_no_drop.py) hears a script of words, a VAD built
from the script hears only the words that are not whispered. With the model: the whispered clip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.test_stream_compute_sweep import Samples
from tests.test_stream_no_drop import JFK, ScriptVAD, Silence, TimelineDecoder, plain
from whisperkv.audio import load_audio
from whisperkv.metrics import normalize_text
from whisperkv.stream.clock import SimulatedClock
from whisperkv.stream.events import Word
from whisperkv.stream.hypothesis import Hypothesis
from whisperkv.stream.runner import run_stream
from whisperkv.stream.session import StreamingSession
from whisperkv.stream.vad import SpeechDetector

SR = 16000
SPEECH = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech"
WHISPERED = ["no", "voiced", "speech", "whatsoever", "here.|"]


def whispered_script(at: float, gap_after: float = 3.5) -> tuple[list, set[str]]:
    """jfk, whispered words from ``at`` seconds (0.45 s each), jfk again ``gap_after`` s after them."""
    whispered = [(w, at + 0.45 * i, at + 0.45 * i + 0.4) for i, w in enumerate(WHISPERED)]
    offset = whispered[-1][2] + gap_after
    words = list(JFK) + whispered + [(t, s + offset, e + offset) for t, s, e in JFK]
    return words, {f"{t}@{s}" for t, s, _ in whispered}


class QuietVAD(ScriptVAD):
    """The script's speech boundaries, blind to its whispered words, which it scores near speech."""

    def __init__(self, words: list, whispered: set[str], near: bool = True) -> None:
        super().__init__([w for w in words if f"{w[0]}@{w[1]}" not in whispered])
        self.whispered = [(s, e) for t, s, e in words if f"{t}@{s}" in whispered]
        self.near = near
        self.asked: list[tuple[float, float]] = []

    def maybe_speech(self, start: int, end: int) -> bool:
        self.asked.append((start / SR, end / SR))
        return self.near and any(start / SR <= s < end / SR for s, _ in self.whispered)

    def last_near_speech(self, start: int) -> int | None:
        """Where the whispered speech heard so far from ``start`` on ends (silero's frames near speech)."""
        ends = [min(int(e * SR), self.position) for s, e in self.whispered if s * SR < self.position]
        ends = [e for e in ends if e > start]
        return max(ends) if self.near and ends else None


def stream(words: list, vad: QuietVAD, compute: float, events: list | None = None) -> tuple:
    decoder = TimelineDecoder(words)
    calls = []
    decode = decoder.decode

    def recorded(audio: np.ndarray, start_sample: int, prompt: str):  # noqa: ANN202
        calls.append((start_sample / SR, (start_sample + len(audio)) / SR))
        return decode(audio, start_sample, prompt)

    decoder.decode = recorded
    session = StreamingSession(decoder, vad=vad)
    for event in run_stream(Silence(words[-1][2] + 1.0), session, SimulatedClock(compute), 1.0):
        if events is not None:
            events.append(event)
    return [w.text.strip() for w in session.agreement.committed], decoder, calls


@pytest.mark.parametrize("compute", [0.0, 0.5, 1.5, 3.0])
def test_words_the_vad_missed_in_a_pause_are_committed_once_in_order(compute):
    """Speech follows the whispered words 1 s after them, before ``QUIET_PAUSE_S`` of quiet."""
    words, whispered = whispered_script(at=11.5, gap_after=1.0)
    events: list = []
    committed, decoder, _ = stream(words, QuietVAD(words, whispered), compute, events)
    assert decoder.neither == []  # every decode's audio began where its prompt ended
    assert committed == [plain(t) for t, _, _ in words]
    # the pause's words open the next utterance: its speech_started comes first (a Realtime item)
    heard = next(i for i, e in enumerate(events) if e.type == "commit" and "voiced" in e.text)
    assert events[heard - 1].type == "speech_started"
    closes = [e for e in events if e.type == "utterance_end"]
    assert [len(e.words) for e in closes] == [len(JFK), len(JFK) + len(WHISPERED)]


@pytest.mark.parametrize("compute", [0.0, 0.5, 1.5, 3.0])
def test_words_the_vad_missed_are_heard_once_the_pause_is_quiet(compute):
    """A Realtime client's server VAD never closes a turn of whispered words, and the next speech may be
    far off (here 12 s): the pause is heard once ``QUIET_PAUSE_S`` of it had no frame near speech, its
    words an utterance of their own, committed before the next speech starts."""
    words, whispered = whispered_script(at=11.5, gap_after=12.0)
    events: list = []
    committed, decoder, _ = stream(words, QuietVAD(words, whispered), compute, events)
    assert decoder.neither == []
    assert committed == [plain(t) for t, _, _ in words]
    heard = next(e for e in events if e.type == "commit" and "voiced" in e.text)
    said = words[len(JFK) + len(WHISPERED) - 1][2]  # the end of the whispered words
    # the quiet, an update under way (a chunk and its decode), a feed, the pause's decode; the next
    # speech starts 12 s after
    assert heard.audio_time <= said + 1.5 + (1.0 + compute) + 0.25 + compute < said + 12.0
    closes = [e for e in events if e.type == "utterance_end"]
    assert [len(e.words) for e in closes] == [len(JFK), len(WHISPERED), len(JFK)]


def test_a_pause_with_nothing_near_speech_is_not_decoded():
    words, whispered = whispered_script(at=11.5)
    vad = QuietVAD(words, whispered, near=False)
    committed, _, calls = stream(words, vad, 0.5)
    assert committed == [plain(t) for t, s, _ in words if f"{t}@{s}" not in whispered]
    pause = vad.asked[0]  # the pause between the two jfk utterances, asked about once
    assert pause[0] == pytest.approx(10.71, abs=0.01) and pause[1] > 14.0
    assert not [c for c in calls if pause[0] - 1.0 <= c[0] < pause[1] - 0.5]  # no decode began in it


def test_a_long_silent_pause_keeps_no_more_than_a_window_of_audio():
    words = list(JFK) + [("later.|", 130.0, 130.5)]
    session = StreamingSession(TimelineDecoder(words), vad=QuietVAD(words, set(), near=False))
    held: list[float] = []

    class Watched(Silence):  # what the session holds each time audio is read
        def read(self, n: int) -> np.ndarray:
            held.append(len(session.audio) / SR)
            return super().read(n)

    list(run_stream(Watched(125.0), session, SimulatedClock(0.5), 1.0))
    assert len(held) > 100 and max(held[-60:]) <= 32.0  # not all 115 s since jfk's utterance ended
    assert [w.text.strip() for w in session.agreement.committed] == [plain(t) for t, _, _ in JFK]


@pytest.mark.parametrize("near", [True, False])
def test_a_word_heard_running_into_what_the_vad_called_silence_is_left_to_the_pause(near):
    """mfa_falsetto2: the VAD heard "I really don't know how" and not the falsetto "people talk like this";
    the close's hearing ran on inside "people", read it as "to do that." and committed it. A word heard
    ending past the VAD's end is now held, and heard again with the pause (whatever the VAD thought of
    the pause: the words were heard)."""
    voiced = JFK[:5]  # "And so my fellow Americans," then, with no pause, words the VAD does not hear
    falsetto = [("people", 2.32, 2.9), ("talk|", 2.95, 3.5)]
    words = voiced + falsetto
    events: list = []
    vad = QuietVAD(words, {"people@2.32", "talk|@2.95"}, near)
    committed, decoder, calls = stream(words, vad, 0.0, events)
    closes = [c for c in calls if c[1] == pytest.approx(2.3 + 0.268, abs=0.01)]
    assert closes  # the close heard the VAD's end: inside "people"
    assert committed == [plain(t) for t, _, _ in words]  # not its piece, " p-25"
    assert decoder.neither == []
    # the close's utterance ends when the words it held are heard: one Realtime item holds them all
    closed = next(i for i, e in enumerate(events) if e.type == "utterance_end")
    assert events[closed].text == "And so my fellow Americans people talk"
    assert [e.text for e in events[:closed] if e.type == "commit"][-1] == "people talk"


def test_a_word_held_at_a_close_is_heard_with_the_speech_that_starts_inside_it():
    """The VAD hears speech again while the word the close held is still being said (its start, padded
    back, falls inside it): heard as a pause up to there, the word was cut again, and committed in
    pieces. The new utterance begins where the last one's buffer began, so the word is heard whole."""
    words = [*JFK[:5], ("people", 2.32, 3.1), ("talk", 3.3, 3.6), ("like", 3.62, 3.9), ("this.|", 3.92, 4.3)]
    events: list = []
    committed, decoder, calls = stream(words, QuietVAD(words, {"people@2.32"}), 0.0, events)
    starts = [e.start for e in events if e.type == "speech_started"]
    assert starts[1] == pytest.approx(3.0) and starts[1] < 3.1  # inside "people"
    assert committed == [plain(t) for t, _, _ in words]
    assert decoder.neither == []
    assert [c for c in calls if c[0] == 0.0 and c[1] > 3.0]  # the second utterance heard from 0 s


@pytest.mark.parametrize("compute", [0.0, 1.5])
def test_speech_the_vad_heard_start_late_is_heard_whole_by_the_utterance(compute):
    """mfa_falsetto2 at 1.5 s per update: the VAD dated the first speech's start after "I really" had
    begun; the pause before it, heard up to there, committed " I" and the utterance, from the VAD's
    start, never heard "really". The pause's words that reach its end are left to the utterance, whose
    buffer begins after the pause's other words."""
    words = list(JFK)  # the VAD does not hear "And so my": its start, padded back, falls inside "my"
    vad = QuietVAD(words, {"And@0.0", "so@0.76", "my@1.04"})
    events: list = []
    committed, decoder, _ = stream(words, vad, compute, events)
    assert [e.start for e in events if e.type == "speech_started"][0] == pytest.approx(1.1, abs=0.01)
    assert committed == [plain(t) for t, _, _ in words]
    assert decoder.neither == []


def test_a_pause_longer_than_a_window_is_heard_window_by_window():
    # the pause runs from 10.54 s for 66 s; whispered words lie across its first window's end (40.54 s)
    words, whispered = whispered_script(at=39.3, gap_after=38.0)
    committed, decoder, calls = stream(words, QuietVAD(words, whispered), 0.5)
    assert decoder.neither == []
    assert committed == [plain(t) for t, _, _ in words]
    assert max(end - start for start, end in calls) <= 30.0 + 1e-6


def test_vad_positions_after_a_reset_are_the_streams():
    """silero's iterator counts samples from its last reset; a client's commit or clear resets it, and a
    later utterance was then dated from the reset, minutes before the audio it held."""
    audio = load_audio(SPEECH / "en" / "jfk.flac")
    vad = SpeechDetector()
    first = vad.process(audio)
    vad.reset()
    again = vad.process(audio)
    assert first and [b.kind for b in again] == [b.kind for b in first]
    assert [b.sample for b in again] == [b.sample + len(audio) for b in first]


@pytest.mark.parametrize("compute", [0.3, 1.5])
def test_the_whispered_clip_keeps_its_last_word(tiny_model, compute):
    """mfa_whisper2 ("there's gonna be no voiced speech whatsoever here"): its last word lies where the VAD
    heard no speech; it was dropped at every compute time."""
    from whisperkv.stream.local_decoder import LocalDecoder

    audio = load_audio(SPEECH / "en" / "mfa_whisper2.flac")
    session = StreamingSession(LocalDecoder(tiny_model), vad=SpeechDetector())
    for _ in run_stream(Samples(audio), session, SimulatedClock(compute), 1.0):
        pass
    committed = normalize_text(session.committed_text()).split()
    assert committed[-1] == "here" and committed.count("here") == 1


#: jfk's first words, then speech the VAD parts in two (pauses of 0.9 s)
PARTED = [*JFK[:5], ("voiced", 3.2, 3.6), ("speech", 3.65, 4), ("whatsoever", 4.9, 5.5), ("here.|", 5.55, 6)]


class Guessing(TimelineDecoder):
    """Hears the words from ``hard`` to ``until`` s otherwise at each hearing, in a buffer that ends before
    ``until``: where the VAD parts whispered speech, what it closed alone. Guessed improbable (0.05), or
    (``undated``) at 0.5 but dated with no length, as the alignment dates speech it cannot place."""

    def __init__(self, words: list, hard: float, until: float, undated: bool = False) -> None:
        super().__init__(words)
        self.hard, self.until, self.undated = hard, until, undated

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str):  # noqa: ANN201
        heard = super().decode(audio, start_sample, prompt)
        if (start_sample + len(audio)) / SR >= self.until:
            return heard
        b0 = start_sample / SR
        guess = f" guess{self.decodes}"
        words = [
            (Word(guess, w.start, w.start, 0.5) if self.undated else Word(guess, w.start, w.end, 0.05))
            if w.start + b0 >= self.hard
            else w
            for w in heard.words
        ]
        return Hypothesis(words, heard.segment_ends, heard.boundaries)


@pytest.mark.parametrize("compute", [0.0, 0.5, 1.5])
def test_words_a_close_hears_as_improbable_are_heard_again_with_what_follows(compute):
    """mfa_whisper2 at 1.5 s per update: the VAD closed "voiced" alone; heard with and without the prompt
    it was improbable words ("Points P advising from me to come.", 0.00-0.11), and they were committed.
    New words of a close that look hallucinated (these are improbable) are now held once, and heard with
    what follows ("Boy, speech whatsoever here.")."""
    words = list(PARTED)
    decoder = Guessing(words, hard=3.2, until=4.9)
    session = StreamingSession(decoder, vad=ScriptVAD(words))
    list(run_stream(Silence(7.0), session, SimulatedClock(compute), 1.0))
    assert [w.text.strip() for w in session.agreement.committed] == [plain(t) for t, _, _ in words]


@pytest.mark.parametrize("compute", [0.0, 0.5, 1.5])
def test_words_a_close_dates_with_no_length_are_heard_again_with_what_follows(compute):
    """The utterances file (int8, 0.1 s per update) closed an utterance on "I have a little bit of a thick
    tip.", probable enough (0.06-0.77) but dated with no length: Whisper's hallucination rule rejects such
    words, and they are held and heard again with what follows, as improbable ones are."""
    words = list(PARTED)
    decoder = Guessing(words, hard=3.2, until=4.9, undated=True)
    session = StreamingSession(decoder, vad=ScriptVAD(words))
    list(run_stream(Silence(7.0), session, SimulatedClock(compute), 1.0))
    assert [w.text.strip() for w in session.agreement.committed] == [plain(t) for t, _, _ in words]


@pytest.mark.parametrize("compute", [0.0, 0.5, 1.5])
def test_words_a_close_held_are_heard_once_the_pause_is_quiet(compute):
    """The utterances file at 0.3 s per update: its close held "Well, what are you going to do?" (they
    looked hallucinated) until the next speech, 5.7 s after they were said. Where none follows within
    ``QUIET_PAUSE_S``, the held words are heard with the quiet after them, and their utterance ends
    with them (a Realtime item completed with its own words)."""
    words = list(PARTED[:7])  # "... Americans," and "voiced speech" (0.9 s apart), then 10 s of silence
    decoder = Guessing(words, hard=3.2, until=4.9)
    events: list = []
    session = StreamingSession(decoder, vad=ScriptVAD(words))
    events = list(run_stream(Silence(14.0), session, SimulatedClock(compute), 1.0))
    assert [w.text.strip() for w in session.agreement.committed] == [plain(t) for t, _, _ in words]
    heard = next(e for e in events if e.type == "commit" and "voiced" in e.text)
    closed_at = words[-1][2] + 0.268  # the VAD's end
    assert heard.audio_time <= closed_at + 1.5 + (1.0 + compute) + 0.25 + compute < 14.0
    closes = [e for e in events if e.type == "utterance_end"]
    assert [e.text for e in closes] == ["And so my fellow Americans", "voiced speech"]  # the VAD's two


def test_a_clear_ends_the_utterance_that_waited_on_words_it_held():
    """A client's clear drops the audio of the words a close held: the utterance (a Realtime item) that
    waited on them ends with the words it committed, not never."""
    words = list(PARTED[:7])
    session = StreamingSession(Guessing(words, hard=3.2, until=4.9), vad=ScriptVAD(words))
    events = []
    for _ in range(int(4.8 / 0.25)):  # to 0.5 s after the VAD's end: the close held the guessed words
        events += session.feed(np.zeros(int(0.25 * SR), dtype=np.float32)) + session.update()
    assert [e.text for e in events if e.type == "utterance_end"] == ["And so my fellow Americans"]
    ended = session.clear()
    assert [(e.type, e.text) for e in ended] == [("utterance_end", "")]  # "voiced speech": dropped
    assert session.clear() == []


class RepeatsUndated(TimelineDecoder):
    """Dates a word that repeats the one before with no length, as the alignment dated mfa_words' run."""

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str):  # noqa: ANN201
        heard = super().decode(audio, start_sample, prompt)
        words = heard.words[:1] + [
            Word(w.text, w.start, w.start, w.probability) if w.text == before.text else w
            for before, w in zip(heard.words, heard.words[1:])
        ]
        return Hypothesis(words, heard.segment_ends, heard.boundaries)


@pytest.mark.parametrize("compute", [0.0, 0.5])
def test_a_run_of_a_repeated_word_dated_with_no_length_is_committed_at_its_close(compute):
    """mfa_words' "Word. Word. Word.", each "word" said once: the alignment dates the repeats with no
    length, which the hallucination rule counts against them. Held, they were heard again with what
    followed and one "word" too many came back; the close commits them (the rule does not count a
    repeat's length), before the next utterance is said."""
    run = [(f"word.{'|' if i == 3 else ''}", 3.2 + 0.6 * i, 3.6 + 0.6 * i) for i in range(4)]
    words = [*JFK[:5], *run, ("ask", 7.5, 7.9), ("not.|", 8.0, 8.5)]
    session = StreamingSession(RepeatsUndated(words), vad=ScriptVAD(words))
    events = list(run_stream(Silence(9.5), session, SimulatedClock(compute), 1.0))
    assert [w.text.strip() for w in session.agreement.committed] == [plain(t) for t, _, _ in words]
    by_then = sum(len(e.words) for e in events if e.type == "commit" and e.audio_time < 7.5)
    assert by_then == len(words) - 2


def test_words_improbable_at_every_hearing_are_held_once_not_again():
    """Speech the model cannot read (noise, another language) is improbable at every close: held once,
    then committed by the next close, as guessed, not held on from utterance to utterance."""
    words = [*PARTED, ("ask", 7.0, 7.4), ("not.|", 7.5, 8.0)]
    session = StreamingSession(Guessing(words, hard=3.2, until=float("inf")), vad=ScriptVAD(words))
    events = list(run_stream(Silence(9.0), session, SimulatedClock(0.0), 1.0))
    assert len(session.agreement.committed) == len(words)
    by_then = sum(len(e.words) for e in events if e.type == "commit" and e.audio_time < 7.0)
    assert by_then == len(words) - 2  # all but the last utterance's, before it was said


class StopsAtThanks(TimelineDecoder):
    """Hears nothing after "thanks." in a buffer that starts before it (the end of text, to the model)."""

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str):  # noqa: ANN201
        heard = super().decode(audio, start_sample, prompt)
        thanks = next((i for i, w in enumerate(heard.words) if w.text == " thanks"), None)
        if thanks is None:
            return heard
        ends = [(e, n) for e, n in zip(heard.segment_ends, heard.boundaries) if n <= thanks + 1]
        return Hypothesis(heard.words[: thanks + 1], [e for e, _ in ends], [n for _, n in ends])


@pytest.mark.parametrize("compute", [0.0, 0.5, 1.5])
def test_speech_after_where_every_hearing_stops_is_heard_with_what_follows(compute):
    """The utterances file at 3 s per update: every hearing of a buffer from 94.8 s stopped at "... all
    thanks.", and the close committed that and moved on: "She had your dark suit in greasy wash water all
    year" (3 s more of the utterance) was never heard. Where the close's hearing stops ``GAP_S`` or more
    before the VAD's end, the rest is heard again with what follows."""
    words = [*JFK[:5], ("thanks.|", 2.4, 2.8), ("she", 3.0, 3.3), ("had", 3.35, 3.7), ("your", 3.75, 4.0)]
    words += [("dark", 4.1, 4.5), ("suit.|", 4.6, 5.5), ("ask", 7.0, 7.4), ("not.|", 7.5, 8.0)]
    session = StreamingSession(StopsAtThanks(words), vad=ScriptVAD(words))
    list(run_stream(Silence(9.0), session, SimulatedClock(compute), 1.0))
    assert [w.text.strip() for w in session.agreement.committed] == [plain(t) for t, _, _ in words]


@pytest.mark.parametrize("compute", [0.0, 0.5, 1.5, 3.0])
def test_speech_a_close_stopped_short_of_by_a_second_is_heard_with_what_follows(compute):
    """lj001 with the VAD at 3 s per update: the close heard up to "which", 1.6 s before the VAD's end,
    and "obtained at that time" was lost when the VAD heard speech again 10 ms later. A close that stops
    ``STOPPED_SHORT_S`` (1 s) or more before the end holds the rest (here 1.5 s: "she had your")."""
    words = [*JFK[:5], ("thanks.|", 2.4, 2.8), ("she", 3.0, 3.3), ("had", 3.35, 3.7), ("your.|", 3.75, 4.0)]
    words += [("ask", 7.0, 7.4), ("not.|", 7.5, 8.0)]
    session = StreamingSession(StopsAtThanks(words), vad=ScriptVAD(words))
    list(run_stream(Silence(9.0), session, SimulatedClock(compute), 1.0))
    assert [w.text.strip() for w in session.agreement.committed] == [plain(t) for t, _, _ in words]


@pytest.mark.parametrize("compute", [0.1, 0.5])
def test_the_falsetto_clip_has_no_words_the_close_made_of_a_cut_off_one(tiny_model, compute):
    """mfa_falsetto2 ("i really don't know how people talk like this"): the VAD closed the utterance inside
    the falsetto "people", and the close committed what it made of that piece, "to do that."."""
    from whisperkv.stream.local_decoder import LocalDecoder

    audio = load_audio(SPEECH / "en" / "mfa_falsetto2.flac")
    session = StreamingSession(LocalDecoder(tiny_model), vad=SpeechDetector())
    for _ in run_stream(Samples(audio), session, SimulatedClock(compute), 1.0):
        pass
    committed = normalize_text(session.committed_text()).split()
    assert "that" not in committed and committed[-2:] == ["like", "this"]


def test_a_word_before_one_cut_off_at_the_end_of_the_audio_is_not_final_at_once(tiny_model):
    """ls_61-70968-0000 ("he began a confused complaint ..."), no VAD, 0.1 s per update: the first
    second was heard as "He began to confuse.", and ``--confident`` committed "to" at that hearing ("to"
    sure, a word after it heard), though that word was cut off at the end of the audio. Every later
    hearing read "a confused"; the stream said "began to confused"."""
    from whisperkv.stream.local_decoder import LocalDecoder

    audio = load_audio(SPEECH / "en" / "ls_61-70968-0000.flac")
    session = StreamingSession(LocalDecoder(tiny_model), vad=None, confident=0.5)
    for _ in run_stream(Samples(audio), session, SimulatedClock(0.1), 1.0):
        pass
    said = normalize_text(session.committed_text()).split()
    assert said[:5] == ["he", "began", "a", "confused", "complaint"]
