"""A streaming session: feed audio as it arrives, call ``update`` now and then, get events.

The policy, in whisper_streaming's terms: the buffer holds the current utterance's audio; each update
decodes it with the committed text before it as the prompt; LocalAgreement-2 commits what two consecutive
hypotheses agree on; past ``trim_after`` s the buffer is cut at a committed segment end, ``CONTEXT_S``
before the words not yet settled (cut at a sentence's end, tiny.en read the next one's first words cold).

A slow stream lags, it does not drop words: audio leaves the buffer only at a cut between two words of
the current hypothesis, every word before which is committed (not at a segment's timestamp, which may
fall inside its last word), and the prompt is exactly the committed words before the cut, so the buffer
begins where its prompt ends (a cut inside "you" with a prompt ending "... can do for" lost jfk's "what
you can do for your" at 1.5 s per update). Words held until the buffer's cap by one no two hearings agree
on are committed as last heard (``STALL_UPDATES``), not left at the start of a buffer the model may skip.
A word two hearings date so long that it may hide skipped speech is heard again, once, from a buffer cut
nearer to it (``_hear_again``).

With a VAD, silence never enters an utterance's buffer and the end of speech closes the utterance: its
last hypothesis is committed whole, but for words heard running past the VAD's end, and new words that
look hallucinated (``Hypothesis.doubtful``, once): both are heard again with what follows, and the
utterance ends with them. End of input closes too. What the VAD called a pause is heard once, whole,
when it is over or quiet (``pauses``). Without a VAD, a stretch of ``GAP_S`` or more with no word heard
is heard once alone (``_hear_gap``). Committed text is never retracted. ``confident`` (off by default)
also commits a word the model was sure of at its first hearing (``agreement``). Decoding is behind
``UpdateDecoder``: the policy does not know where it runs.
"""

from __future__ import annotations

import numpy as np

from whisperkv.audio import SAMPLE_RATE
from whisperkv.stream.agreement import LocalAgreement, same_word, stretched
from whisperkv.stream.events import Event, Word, join_words
from whisperkv.stream.hypothesis import CONTEXT_S, WORD_AT_END_S, Hypothesis, UpdateDecoder
from whisperkv.stream.long_words import LongWordHearing
from whisperkv.stream.pauses import GAP_S, WINDOW, PauseHearing
from whisperkv.stream.vad import SpeechDetector

#: characters of committed text given as the prompt (whisper_streaming uses 200)
PROMPT_CHARS = 200
#: audio kept before the current position while nobody speaks: the VAD dates a start back by its padding
HISTORY_S = 1.0
#: at the buffer's cap, after this many updates that committed nothing, words pending ``STALL_S`` before
#: the audio heard are committed as last heard (the utterances' "soil price.", read otherwise at each of
#: ten hearings, held 15 words; the buffer cut before it was heard from 5.6 s on)
STALL_UPDATES, STALL_S = 5, 10.0
#: a VAD close whose hearing ends this far before the VAD's end of speech holds what it did not hear, to be
#: heard with what follows (lj001 at 3 s per update: a close that heard up to "which", 1.6 s before the
#: end, lost "obtained at that time" when the VAD heard speech again 10 ms after it)
STOPPED_SHORT_S = 1.0


class StreamingSession(PauseHearing, LongWordHearing):
    def __init__(
        self,
        decoder: UpdateDecoder,
        *,
        vad: SpeechDetector | None = None,
        min_audio_s: float = 0.5,
        trim_after: float = 6.0,
        max_buffer: float = 25.0,
        confident: float | None = None,
    ) -> None:
        self.decoder = decoder
        self.vad = vad
        self.min_audio = int(min_audio_s * SAMPLE_RATE)
        self.trim_after = trim_after
        self.max_buffer = max_buffer
        self.agreement = LocalAgreement(confident)
        self.audio = np.zeros(0, dtype=np.float32)
        self.audio_start = 0  # stream sample index of self.audio[0]
        self.received = 0
        self.in_speech = vad is None
        self.buffer_start = 0
        self.decoded: tuple[int, int] | None = None  # (buffer start, end) the last decode saw
        self.closed_at = 0  # where the last utterance ended (its end as the VAD padded it)
        self.gap_heard_to = 0.0  # without a VAD: the stream is heard alone up to here (seconds)
        self.pause_from = 0  # where the audio between utterances not yet decoded begins
        #: where the last utterance's buffer began and its first committed word (a cut between words)
        self.last_buffer: tuple[int, int] | None = None
        self.utterance: list[Word] = []
        #: where the open utterance's audio begins and its first committed word: its close hears it whole
        self.utterance_from = (0, 0)
        #: words committed when the open utterance began with words the last close held (``_open``)
        self.reheard: int | None = None
        #: the span of a closed utterance whose close held words: its end waits for them (``_end_utterance``)
        self.ending: tuple[float, float] | None = None
        self.decodes = 0  # buffers decoded (a clock charges an update's cost to a span that decoded)

    @property
    def now(self) -> float:
        return self.received / SAMPLE_RATE

    def feed(self, samples: np.ndarray) -> list[Event]:
        """Add audio (16 kHz float32); returns speech boundaries and, where an utterance ends, its commits."""
        samples = np.asarray(samples, dtype=np.float32)
        self.audio = np.concatenate([self.audio, samples])
        self.received += len(samples)
        events: list[Event] = []
        if self.vad is not None:
            for boundary in self.vad.process(samples):
                if boundary.kind == "start":
                    events += self._open(boundary.sample)
                else:
                    t = boundary.sample / SAMPLE_RATE
                    events.append(Event("speech_stopped", start=t, end=t, audio_time=self.now))
                    events += self._close(boundary.sample, speech_stopped=True)
        if not self.in_speech:
            events += self._hear_quiet_pause()
        if not self.in_speech and self.received - self.pause_from >= WINDOW * SAMPLE_RATE:
            events += self._hear_lone_pause(self.pause_from + WINDOW * SAMPLE_RATE)
        self._forget_old_audio()
        return events

    def update(self) -> list[Event]:
        """Decode the buffer if it holds new speech; commit what the last two hypotheses agree on."""
        if not self.in_speech or self.received - self.buffer_start < self.min_audio:
            return []
        if self.decoded == (self.buffer_start, self.received):
            return []  # nothing new to hear
        hypothesis = self._decode(self.received)
        if hypothesis.repetitive:  # a loop is no evidence: neither agreed with nor kept as the last one
            return []
        heard_end = self.decoded[1] / SAMPLE_RATE  # set by this decode
        heard = self._hear_gap(hypothesis) if self.vad is None else None
        if heard is not None:  # the buffer now starts after the gap's words: the next update hears on
            return heard
        events = self._commit(self.agreement.update(hypothesis.words, heard_end))
        if self.agreement.previous:
            events.append(Event.of_words("partial", self.agreement.previous, self.now))
        if self.agreement.skipping is not None:
            self._hear_again(hypothesis, self.agreement.skipping)
        return events + self._trim(hypothesis)

    def finish(self) -> list[Event]:
        """End of input: what is left is committed."""
        if self.in_speech:
            return self._close(self.received)
        return self._commit(self.agreement.flush()) + self._hear_lone_pause(self.received)

    @property
    def has_speech(self) -> bool:
        """Whether audio of an unfinished utterance is waiting (what a client's commit would close)."""
        return self.in_speech and (
            self.received - self.buffer_start >= self.min_audio // 5 or bool(self.utterance)
        )

    def warm(self) -> None:
        """Before audio arrives: run what the first update needs once (decoder, VAD, word comparison), so
        the first commit's latency is like the later ones'. A decoder or VAD without ``warm`` is left so."""
        for part in (self.decoder, self.vad):
            warm = getattr(part, "warm", None)
            if warm is not None:
                warm()
        same_word(Word(" warm", 0.0, 0.1), Word(" warm", 0.0, 0.1))  # loads the text normaliser

    def commit(self) -> list[Event]:
        """Close the current utterance now, as a client's commit asks: what was heard is committed."""
        events = self._close(self.received) if self.in_speech else self._hear_lone_pause(self.received)
        if self.vad is not None:
            self.vad.reset()
        return events

    def clear(self) -> list[Event]:
        """Drop the audio not yet committed (committed text stays, it is never retracted); a closed
        utterance that waited on words it held ends without them."""
        ended = self._end_utterance(self.closed_at) if self.ending is not None else []
        self.buffer_start = self.pause_from = self.received
        self.last_buffer = None
        self.agreement.first_in_buffer = len(self.agreement.committed)
        self.utterance_from = (self.received, len(self.agreement.committed))  # never heard again
        self.agreement.forget_pending()
        self.decoded = None
        self.utterance, self.ending = [], None
        if self.vad is not None:
            self.vad.reset()
            self.in_speech = False
        return ended

    @property
    def held(self) -> bool:
        """Whether the last close held words (``_close``) not yet heard again: heard whatever the VAD says."""
        return self.pause_from < self.closed_at

    def committed_text(self) -> str:
        return self.agreement.committed_text()

    def reuse_summary(self) -> dict:
        return self.decoder.reuse_summary()

    # -- inside --------------------------------------------------------------------------------------

    def _decode(self, end: int, closing: bool = False) -> Hypothesis:
        """The buffer up to ``end`` heard with the prompt, or without it where the prompt started a loop or
        (a closing decode, committed whole) fails Whisper's hallucination rule: a prompt ending "Word. Word."
        made mfa_words' last utterance, "word" said once, close as five "Word."s; heard without it, one."""
        end = min(end, self.buffer_start + WINDOW * SAMPLE_RATE)
        audio = self.audio[self.buffer_start - self.audio_start : end - self.audio_start]
        self.decoded = (self.buffer_start, end)
        self.decodes += 1
        prompt = self._prompt()
        hypothesis = self.decoder.decode(audio, self.buffer_start, prompt)
        if prompt and (hypothesis.repetitive or (closing and hypothesis.looks_hallucinated)):
            # transcribe also stops conditioning on previous text after a window it had to decode hot
            hypothesis = self.decoder.decode(audio, self.buffer_start, "")
        return hypothesis.shifted(self.buffer_start / SAMPLE_RATE)

    def _prompt(self) -> str:
        """Committed text whose audio is no longer in the buffer (what is in it, the buffer says itself)."""
        return join_words(self.agreement.committed[: self.agreement.first_in_buffer])[-PROMPT_CHARS:]

    def _cut(self, sample: int, carried: int = 0) -> None:
        """Start the buffer at ``sample``; the last ``carried`` committed words are still heard in it."""
        if sample <= self.buffer_start:
            return
        self.buffer_start = sample
        self.agreement.fresh = False
        committed, first = len(self.agreement.committed), self.agreement.first_in_buffer
        self.agreement.first_in_buffer = min(committed, max(first, committed - max(carried, 0)))
        self.decoded = None

    def _carried(self, count: int) -> int:
        """The committed words a cut after the last hypothesis' first ``count`` words leaves in the buffer:
        its committed words after the cut, and the committed words it did not hear (a hearing that stopped
        short of them: counted out, they went into the prompt while the buffer still held them)."""
        agreement = self.agreement
        unheard = len(agreement.committed) - agreement.first_in_buffer - agreement.final
        return agreement.final - count + max(unheard, 0)

    def _commit(self, words: list[Word]) -> list[Event]:
        if not words:
            return []
        self.agreement.fresh = False
        self.utterance.extend(words)
        return [Event.of_words("commit", words, self.now)]

    def _open(self, start: int) -> list[Event]:
        """Speech starts at ``start``: the pause before it is heard first (its words open the utterance);
        but words the last close held are heard with this speech, from where that utterance's buffer began
        (mfa_falsetto2's VAD heard speech again inside the word the close had cut)."""
        held = self.last_buffer if self.held else None
        self.reheard = len(self.agreement.committed) if held else None
        ended = self._end_utterance(self.closed_at) if self.ending is not None else []  # held: not heard yet
        heard = [] if held else self._hear_pause(start, speech_follows=True)
        begin, first = held or (min(start, self.pause_from), len(self.agreement.committed))
        self.in_speech = True
        self.buffer_start = max(begin, self.audio_start)
        self.agreement.first_in_buffer = first
        self.utterance_from = (self.buffer_start, first)
        # the VAD pads both ends: speech that starts after the last utterance's unpadded end; and the pause
        # heard no words (mfa_falsetto2's, before its first speech, heard its first word, " I", again)
        fresh = begin == start and not heard and start >= self.closed_at - 2 * getattr(self.vad, "pad", 0)
        self.agreement.fresh = fresh
        t = start / SAMPLE_RATE
        return [*ended, Event("speech_started", start=t, end=t, audio_time=self.now), *heard]

    def _close(self, end: int, speech_stopped: bool = False) -> list[Event]:
        """Close the utterance at ``end``: decode it once more and commit the whole hypothesis, but, where
        the VAD closed it, the words heard ending past its end (dated 0.3 s after the speech it heard): they
        ran on into what it took for silence, may be cut off there, and are heard again with what follows
        (mfa_falsetto2's close committed the falsetto "people" it cut as "to do that."); so is the speech
        after the last word where the hearing stopped ``STOPPED_SHORT_S`` before the VAD's end (the
        utterances file at 3 s per update: "She had your dark suit ...", after "... all thanks.", was never
        heard)."""
        events = self._catch_up(end)
        stopped = end / SAMPLE_RATE if speech_stopped else None
        if self.decoded is not None and self.decoded[0] == self.buffer_start and self.decoded[1] >= end:
            end = self.decoded[1]  # no new speech since: decode exactly the same buffer (reusable)
        last = self._closing_hearing(end, stopped) if end - self.buffer_start >= self.min_audio // 5 else None
        cut_off = False  # words left for a later hearing (aligned again only where the VAD closed it)
        if last is not None and not last.repetitive:
            nearer, last = self._hear_nearer(last, end)
            events += nearer
            rest = self.agreement.unseen(last.words) if stopped is not None else []
            cut_off = any(w.end >= stopped for w in rest)
            # new words that look hallucinated are heard again with what follows, once
            doubted = Hypothesis(rest).doubtful and self.reheard is None
            before = float("-inf") if doubted else stopped
            cut_off = cut_off or doubted
            events += self._commit(self.agreement.flush(last.words, before=before))
        else:  # too short to decode, or decoded as a loop: what the last update heard is committed
            events += self._commit(self.agreement.flush())
        self.ending = (self.buffer_start / SAMPLE_RATE, end / SAMPLE_RATE)
        self.last_buffer = (self.buffer_start, self.agreement.first_in_buffer)
        heard_to = max(self.agreement.last_end, self.utterance_from[0] / SAMPLE_RATE)
        moved = self.reheard is None or len(self.agreement.committed) > self.reheard  # not held in vain
        if stopped is not None and not cut_off and moved and stopped - heard_to >= STOPPED_SHORT_S:
            # the hearing stopped short of the speech: what it did not hear is heard with what follows
            self.last_buffer, cut_off = (int(heard_to * SAMPLE_RATE), len(self.agreement.committed)), True
        if not cut_off:  # else the utterance ends when the words it held are heard (``_end_utterance``)
            events += self._end_utterance(end)
        self.buffer_start = self.closed_at = self.pause_from = max(end, self.buffer_start)
        if cut_off:  # heard again from where the utterance's buffer began (``_open``, ``_pause_buffer``)
            self.pause_from = self.last_buffer[0]  # before ``closed_at``: ``held``
        self.agreement.first_in_buffer = len(self.agreement.committed)
        self.utterance_from = (self.buffer_start, len(self.agreement.committed))
        self.in_speech = self.vad is None
        self._moved_on()
        return events

    def _moved_on(self) -> None:
        """The buffer moved past what the decoder holds (a close, a heard pause): no update reuses it."""
        self.decoded = None
        getattr(self.decoder, "release", lambda: None)()

    def _closing_hearing(self, end: int, stopped: float | None) -> Hypothesis:
        """The utterance's last hearing: of all its audio where that fits a window (as offline hears it:
        the words not yet committed heard with what was said before them; a cut buffer heard lj001-0007's
        "1455" as "14-55"), else of the buffer; also where the whole hearing stops before the words heard
        already (one of mfa_cold_corpus from 0 s stopped before its last words, "Great, thanks.") or,
        where the VAD heard speech stop at ``stopped``, ``GAP_S`` before it (the utterances file at 3 s per
        update: every hearing from 56.5 s stopped at "Alright, thanks.", 9 s of speech before the end), or
        where it dates a new word long enough to hide skipped speech (``agreement.stretched``)."""
        start, first = self.utterance_from
        if self.audio_start <= start < self.buffer_start and end - start <= WINDOW * SAMPLE_RATE:
            heard_to = max([self.agreement.last_end] + [w.end for w in self.agreement.previous])
            heard_to = max(heard_to, (stopped or 0.0) - GAP_S + WORD_AT_END_S)
            kept = self.buffer_start, self.agreement.first_in_buffer
            self.buffer_start, self.agreement.first_in_buffer = start, first
            whole = self._decode(end, closing=True)
            words, last = whole.words, self.agreement.last_end
            skips = any(stretched(words, i) and words[i].end > last for i in range(len(words)))
            if not whole.repetitive and words and words[-1].end >= heard_to - WORD_AT_END_S and not skips:
                return whole
            self.buffer_start, self.agreement.first_in_buffer = kept
        return self._decode(end, closing=True)

    def _catch_up(self, end: int) -> list[Event]:
        """A stream that fell behind (updates slower than the audio) may close an utterance longer than one
        30 s window: commit it window by window, each up to its last complete segment, so no audio is lost."""
        events: list[Event] = []
        while end - self.buffer_start > WINDOW * SAMPLE_RATE:
            start = self.buffer_start / SAMPLE_RATE
            words, cut = self._decode(end).window_cut(start, start + WINDOW)  # the buffer's first 30 s
            events += self._commit(self.agreement.flush(words))
            self._cut(int(cut * SAMPLE_RATE))
        return events

    def _trim(self, hypothesis: Hypothesis) -> list[Event]:
        """Cut the buffer at the last committed segment (or sentence) end once it is long; never past 30 s."""
        events: list[Event] = []
        start, settled = self.buffer_start / SAMPLE_RATE, self.agreement.settled
        if (self.received - self.buffer_start) / SAMPLE_RATE > self.trim_after:
            cuts = hypothesis.cuts_within(settled, start, CONTEXT_S, self.received / SAMPLE_RATE)
            if cuts:
                count, cut = cuts[-1]
                self._cut(int(cut * SAMPLE_RATE), carried=self._carried(count))
        if (self.received - self.buffer_start) / SAMPLE_RATE > self.max_buffer:
            agreement = self.agreement
            heard = (self.decoded[1] if self.decoded else self.received) / SAMPLE_RATE
            if agreement.last_end <= self.buffer_start / SAMPLE_RATE:  # nothing agreed for too long
                # but a word that reaches the buffer's end may still be being said: heard again next time
                events += self._commit(agreement.flush(before=heard - WORD_AT_END_S))
            elif agreement.unagreed >= STALL_UPDATES and agreement.previous[0].end < heard - STALL_S:
                events += self._commit(agreement.flush(before=heard - STALL_S))  # a stall
            # between two words heard twice, ``CONTEXT_S`` before the next (the first words after a cut
            # are counted as committed, not matched: a repeated "word" was once taken for the last one)
            cuts = hypothesis.cuts_within(agreement.settled, start, CONTEXT_S, heard, anywhere=True)
            # or none does: the cut that keeps the most (cut right after "She had your", the utterances
            # file's buffer was read as nonsense, 18 s of speech lost)
            cuts = cuts or hypothesis.cuts_within(agreement.settled, start, 0.0, heard, anywhere=True)[:1]
            # else after the last word heard twice: the words final at their first hearing
            # (``confident``) stay in the buffer, carried, until a second hearing settles where they end
            count, cut = cuts[-1] if cuts else (agreement.settled, agreement.settled_end)
            cut = min([cut] + [w.start for w in agreement.previous[:1]])
            if cut > start:  # never into a pending word
                self._cut(int(cut * SAMPLE_RATE), carried=agreement.final - count)
            elif not hypothesis.words and self.decoded is not None:  # a long silence heard as no words
                self._cut(self.decoded[1] - int(HISTORY_S * SAMPLE_RATE))
        return events

    def _forget_old_audio(self) -> None:
        keep_from = self.buffer_start if self.in_speech else self.received - int(HISTORY_S * SAMPLE_RATE)
        if self.in_speech and self.received - self.utterance_from[0] <= WINDOW * SAMPLE_RATE:
            keep_from = min(keep_from, self.utterance_from[0])  # the close hears the utterance whole
        if not self.in_speech:  # the pause is decoded once it is over, after the last utterance's words
            keep_from = min(keep_from, self.pause_from, *(self.last_buffer or (self.pause_from,))[:1])
        keep_from = max(self.audio_start, min(keep_from, self.received))
        if keep_from - self.audio_start > SAMPLE_RATE:  # drop in pieces of at least a second
            self.audio = self.audio[keep_from - self.audio_start :]
            self.audio_start = keep_from
