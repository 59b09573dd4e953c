"""Hearing a stretch no utterance's words cover: what the VAD called a pause, once, whole, when it is
over; without a VAD, a gap with no word heard before a new word, once, alone (``_hear_gap``; issue 42).

silero-vad scored mfa_whisper2's whispered half at most 0.13 against its 0.5 threshold, so that audio never
entered an utterance's buffer. A pause with a frame that came near speech is decoded when it is over (the
next speech starts, a window of it has passed, or input ends) or quiet (``_hear_quiet_pause``): words the
VAD did not take for speech are committed like an utterance's last hypothesis, and a silent pause is
judged silence by ``transcribe``'s rule. A part of ``StreamingSession``: it moves the session's buffer
and agreement as the session does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from whisperkv.audio import SAMPLE_RATE
from whisperkv.stream.events import Event, join_words
from whisperkv.stream.hypothesis import WORD_AT_END_S

if TYPE_CHECKING:
    import numpy as np

    from whisperkv.stream.agreement import LocalAgreement
    from whisperkv.stream.events import Word
    from whisperkv.stream.hypothesis import Hypothesis, UpdateDecoder
    from whisperkv.stream.vad import SpeechDetector

#: seconds of audio one decode sees (Whisper's window)
WINDOW = 30
#: without a VAD, a stretch this long with no word heard before a new word is heard alone (``_hear_gap``)
GAP_S = 2.0
#: with a VAD, a pause with something to hear is heard once this much of it has passed with no frame near
#: speech (``_hear_quiet_pause``)
QUIET_PAUSE_S = 1.5


class PauseHearing:
    """The pause's hearing; the session's state and steps it uses, named."""

    agreement: LocalAgreement
    decoder: UpdateDecoder
    vad: SpeechDetector | None
    audio: np.ndarray
    min_audio: int
    audio_start: int
    buffer_start: int
    pause_from: int  # where the audio between utterances not yet decoded begins
    closed_at: int
    received: int
    utterance: list[Word]  # the words committed since the last utterance_end
    ending: tuple[float, float] | None  # the span of a close that held words (``_end_utterance``)
    last_buffer: tuple[int, int] | None
    decoded: tuple[int, int] | None
    gap_heard_to: float  # without a VAD: where the last gap heard alone ended (seconds)

    @property
    def held(self) -> bool: ...

    def _decode(self, end: int, closing: bool = False) -> Hypothesis: ...

    def _commit(self, words: list[Word]) -> list[Event]: ...

    def _moved_on(self) -> None: ...

    def _cut(self, sample: int, carried: int = 0) -> None: ...

    def _hear_pause(self, end: int, speech_follows: bool = False) -> list[Event]:
        """Decode the pause from ``pause_from`` to ``end`` once, whole, and commit what it holds; a pause
        longer than a window is heard window by window, each cut after its last complete segment. Where
        speech follows (the VAD's start at ``end`` may come after the speech began), the words reaching
        ``end`` are left to the utterance: ``pause_from`` is then where they begin (``_open``)."""
        start = self.pause_from
        if min(end, start + WINDOW * SAMPLE_RATE) - start < self.min_audio:
            if speech_follows:  # too short to hear: the utterance begins at its speech (``_open``)
                self.pause_from = max(start, end)
            return []
        maybe_speech = getattr(self.vad, "maybe_speech", None)  # a VAD that cannot tell: every pause
        if maybe_speech is not None and not self.held and not maybe_speech(start, end):
            self.pause_from, self.last_buffer = end, None  # nothing to hear: no audio kept for it
            return []
        begin = self._pause_buffer(start, end)
        end = min(end, begin + WINDOW * SAMPLE_RATE)
        hypothesis = self._decode(end)
        heard, cut = [] if hypothesis.repetitive else hypothesis.words, end / SAMPLE_RATE
        if heard and end - begin == WINDOW * SAMPLE_RATE:  # a window of pause: cut it between words
            heard, cut = hypothesis.window_cut(begin / SAMPLE_RATE, cut)
        reaching = speech_follows and bool(heard) and heard[-1].end >= cut - WORD_AT_END_S
        events = self._commit(self.agreement.flush(heard, before=cut - WORD_AT_END_S if reaching else None))
        if reaching:  # the pause's audio ends after the words it committed (between words)
            cut = min(cut, max(self.agreement.last_end, start / SAMPLE_RATE))
        self.pause_from = max(int(cut * SAMPLE_RATE), start + 1)
        self.last_buffer = (self.pause_from, len(self.agreement.committed))  # a cut between words
        self.buffer_start = self.closed_at = max(self.pause_from, self.closed_at)
        self._moved_on()
        return events

    def _hear_quiet_pause(self) -> list[Event]:
        """A pause with something to hear — words the last close held, or frames near speech — is heard
        once ``QUIET_PAUSE_S`` of it has passed with no frame near speech, not only when speech starts
        again, a window has passed or input ends: a Realtime client whose server VAD closes its turns may
        send no more speech (its whispered last words waited), and the utterances file at 0.3 s per update
        committed "Well, what are you going to do?", held by its close, 5.7 s after it was said."""
        near = getattr(self.vad, "last_near_speech", None)
        last = near(self.pause_from) if near is not None else None
        if last is None and not self.held:
            return []
        quiet_from = max(self.closed_at, self.pause_from, last or 0)
        if self.received - quiet_from < QUIET_PAUSE_S * SAMPLE_RATE:
            return []
        return self._hear_lone_pause(self.received)

    def _hear_lone_pause(self, end: int) -> list[Event]:
        """The pause up to ``end`` heard with no speech after it: its words end an utterance (with the
        words the last close held, if it held any)."""
        return self._hear_pause(end) + self._end_utterance(end)

    def _end_utterance(self, end: int) -> list[Event]:
        """The ``utterance_end`` of the words committed since the last one, where there are any or a close
        waits on words it held (``ending``): a close that held words ends when they are heard, so a
        Realtime item is completed with its own words; a pause heard alone is an utterance of its own."""
        if self.ending is None and not self.utterance:
            return []
        start = self.ending[0] if self.ending is not None else self.utterance[0].start
        end_s = max(end / SAMPLE_RATE, self.ending[1] if self.ending is not None else 0.0)
        words, self.utterance, self.ending = self.utterance, [], None
        return [Event("utterance_end", join_words(words), start, end_s, self.received / SAMPLE_RATE, words)]

    def _pause_buffer(self, start: int, end: int) -> int:
        """Set the buffer for the pause from ``start``; return where it begins: where the last
        utterance's buffer began (its words are heard again, and recognised as committed) when that
        fits a window with the pause, else at the pause. Decoded from the pause alone, a word the VAD's
        end cut was heard again in pieces ("whatsoever" as "so ever here")."""
        begin, first = self.last_buffer or (start, len(self.agreement.committed))
        if begin < self.audio_start or end - begin > WINDOW * SAMPLE_RATE:
            begin, first = start, len(self.agreement.committed)
        self.buffer_start, self.decoded = begin, None
        self.agreement.first_in_buffer = first
        self.agreement.fresh = first == len(self.agreement.committed)  # nothing committed in the buffer
        return begin

    def _hear_gap(self, hypothesis: Hypothesis) -> list[Event] | None:
        """Without a VAD: a stretch of ``GAP_S`` or more with no word heard, between the committed words
        and the next new word, is heard once alone (no prompt: with it, the utterances file at 3 s per
        update heard "there is going to be no more speech whatsoever here" as nothing, then cut past it).
        Its words (unless the hallucination rule rejects them) are committed, the buffer starts after
        them; None where the gap held none."""
        new = self.agreement.unseen(hypothesis.words)
        start = max(self.agreement.last_end, self.buffer_start / SAMPLE_RATE, self.gap_heard_to)
        if not new or new[0].start - start < GAP_S:
            return None
        end = self.gap_heard_to = new[0].start
        words = self._heard_alone(start, end)
        if not words:
            return None
        events = self._commit(self.agreement.flush(words))
        self._cut(int(self.agreement.last_end * SAMPLE_RATE))  # every word before is committed
        return events

    def _heard_alone(self, start: float, end: float) -> list[Word]:
        """The words of the gap ``start``-``end`` s decoded alone, without the prompt; none where the decode
        loops or fails Whisper's hallucination rule. The gap ends where the hypothesis dates the next word,
        which may cut the words before it: those ending there, and a last one that ends no sentence, are
        left out."""
        first, last = int(start * SAMPLE_RATE), int(end * SAMPLE_RATE)
        audio = self.audio[first - self.audio_start : last - self.audio_start]
        heard = self.decoder.decode(audio, first, "").shifted(start)
        words = [w for w in heard.words if w.end <= end - WORD_AT_END_S]
        if words and not words[-1].ends_sentence:
            words.pop()
        return [] if heard.repetitive or heard.looks_hallucinated else words
