"""One update's hypothesis: the buffer's words with times, and where its segments end.

Built from a window's tokens the way ``transcribe`` cuts them (segments at timestamp pairs), except
that the text after the last complete segment is kept as a final open segment ending at the buffer's
end: in a stream that tail is the newest speech, and the next update decodes it again anyway.
Words come from the alignment heads (``whisperkv.timing``), times relative to the buffer's start.

A segment's end is a timestamp token, a word's end comes from the alignment heads: the two disagree by
tenths of a second (a segment "for you" ending at 7.30 s whose "you" ends at 7.60 s). So a hypothesis
also says how many words each complete segment closes (``boundaries``): a buffer is cut between words,
never inside one. A decode that closes no segment (no timestamp after its first) still has sentence
ends to cut at (``sentence_boundaries``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from whisperkv.engine.segments import PUNCTUATION
from whisperkv.stream.events import Word
from whisperkv.timing import SHORTEST_PLAUSIBLE_WORD, is_segment_anomaly

if TYPE_CHECKING:
    import numpy as np

    from whisperkv.tokenizer import Tokenizer

SECONDS_PER_TIMESTAMP = 0.02
#: a word ending this close to the end of the audio decoded may be cut off there (still being said)
WORD_AT_END_S = 0.2
#: a cut buffer keeps this much committed speech before the words not yet settled (heard again): cut at a
#: sentence's end, tiny.en read the next one's first words cold
CONTEXT_S = 2.0


@dataclass
class Hypothesis:
    words: list[Word] = field(default_factory=list)  # seconds from the buffer's start
    segment_ends: list[float] = field(default_factory=list)  # ends of the complete segments
    #: words before each complete segment's end (one per ``segment_ends``); empty: judged by word times
    boundaries: list[int] = field(default_factory=list)
    #: the decode failed Whisper's repetition check at every temperature (a loop: "Word. Word. ...")
    repetitive: bool = False

    @property
    def looks_hallucinated(self) -> bool:
        """Whisper's hallucination rule (``is_segment_anomaly``: the first words improbable, implausibly
        short or long) on the words; a word of unknown probability is judged by its times alone."""
        return is_segment_anomaly({"words": self._judged(repeats_short=True)}, PUNCTUATION)

    @property
    def doubtful(self) -> bool:
        """The hallucination rule, but a word that repeats the one before is not counted short: the
        alignment dates a run of a repeated word ("Word. Word. Word.") with no length, which says nothing
        of whether it was said (mfa_words' "word"s, each said once, are such a run)."""
        return is_segment_anomaly({"words": self._judged(repeats_short=False)}, PUNCTUATION)

    def _judged(self, repeats_short: bool) -> list[dict]:
        """The words as the hallucination rule reads them; with ``repeats_short`` False a repeated word
        is given the shortest length the rule does not count against it."""
        judged, previous = [], None
        for w in self.words:
            key = w.text.strip(PUNCTUATION + " ").lower()
            start = w.start
            if not repeats_short and key and key == previous:
                start = min(w.start, w.end - SHORTEST_PLAUSIBLE_WORD)
            previous = key
            probability = 1.0 if w.probability is None else w.probability
            judged.append({"word": w.text, "start": start, "end": w.end, "probability": probability})
        return judged

    def word_boundaries(self) -> list[tuple[int, float]]:
        """(words before the cut, the cut's time) for each complete segment end: after the segment's last
        word and the segment's end, but never after the next word's start (the audio of a word not yet
        committed must stay whole in the buffer; a sliver of a committed one may stay too)."""
        counts = self.boundaries or [
            sum(1 for w in self.words if (w.start + w.end) / 2 < end) for end in self.segment_ends
        ]
        cuts = []
        for count, end in zip(counts, self.segment_ends):
            if count <= 0:
                continue
            cut = max(end, self.words[count - 1].end)
            if count < len(self.words):
                cut = min(cut, self.words[count].start)
            cuts.append((count, cut))
        return cuts

    def sentence_boundaries(self) -> list[tuple[int, float]]:
        """(words before the cut, the cut's time) after each word that ends a sentence, before the last
        word: where a decode closed no segment (it ended without a timestamp), the buffer can still be
        cut (whisper_streaming's "sentence" trimming), between the two words, never into the next."""
        return [
            (i + 1, min(w.end, self.words[i + 1].start))
            for i, w in enumerate(self.words[:-1])
            if w.ends_sentence
        ]

    def cuts_within(
        self, settled: int, after: float, context: float, heard_to: float, anywhere: bool = False
    ) -> list[tuple[int, float]]:
        """Where a buffer from ``after`` s may be cut (``word_boundaries``; where the decode closed no
        segment, ``sentence_boundaries``; ``anywhere``: between any two words) within its first
        ``settled`` words, ``context`` s or more before the word after them (or ``heard_to``): that word
        is then heard with what was said before it. A decode that ran on without timestamps once heard
        "And that should be all. Thanks." then skipped the next sentence until the buffer was cut past it."""
        words = self.words
        gaps = [(i, min(words[i - 1].end, words[i].start)) for i in range(1, len(words))] if anywhere else []
        cuts = [c for c in gaps or self.word_boundaries() if c[0] <= settled and c[1] > after]
        cuts = cuts or [c for c in self.sentence_boundaries() if c[0] <= settled and c[1] > after]
        pending_at = words[settled].start if settled < len(words) else heard_to
        return [c for c in cuts if c[1] <= pending_at - context]

    def window_cut(self, start: float, window_end: float) -> tuple[list[Word], float]:
        """Of a full window's hypothesis (dated in the stream, its buffer from ``start`` s): the words up
        to its last complete segment and the cut after them (a second past ``start`` at least); without
        one, the words that end before the window's end (one that reaches it may be cut off there) and a
        cut before the next word."""
        ahead = start + 1.0  # each window moves on by a second at least
        cuts = [c for c in self.word_boundaries() if c[1] >= ahead]
        if cuts:
            count, cut = cuts[-1]
            return self.words[:count], cut
        words = [w for w in self.words if w.end < window_end - WORD_AT_END_S]
        rest = self.words[len(words) :]
        return words, max(ahead, min([window_end] + [w.start for w in rest[:1]]))

    @property
    def text(self) -> str:
        return "".join(w.text for w in self.words).strip()

    def shifted(self, offset: float) -> Hypothesis:
        """The same hypothesis with times counted from the stream's start."""
        return Hypothesis(
            [Word(w.text, w.start + offset, w.end + offset, w.probability) for w in self.words],
            [e + offset for e in self.segment_ends],
            list(self.boundaries),
            self.repetitive,
        )


class UpdateDecoder(Protocol):
    """What a stream's updates are decoded by: in this process (``LocalDecoder``) or on the server's
    scheduler (``SchedulerDecoder``); the session does not know which."""

    def decode(self, audio: np.ndarray, start_sample: int, prompt: str) -> Hypothesis: ...

    def reuse_summary(self) -> dict: ...


def split_segments(tokens: list[int], tokenizer: Tokenizer, duration: float) -> tuple[list[dict], int]:
    """Segments (``seek`` 0, start, end, text, tokens) of one window's tokens, and how many are closed."""
    begin = tokenizer.timestamp_begin

    def time(token: int) -> float:
        return (token - begin) * SECONDS_PER_TIMESTAMP

    def segment(piece: list[int], start: float, end: float) -> dict:
        text = tokenizer.decode([t for t in piece if t < tokenizer.eot])
        return {"seek": 0, "start": start, "end": end, "text": text, "tokens": piece}

    is_ts = [t >= begin for t in tokens]
    cuts = [i for i in range(1, len(tokens)) if is_ts[i - 1] and is_ts[i]]
    segments, last = [], 0
    for cut in cuts:
        piece = tokens[last:cut]
        segments.append(segment(piece, time(piece[0]), time(piece[-1])))
        last = cut
    rest = tokens[last:]
    if not any(t < tokenizer.eot for t in rest):
        return segments, len(segments)
    start = time(rest[0]) if is_ts[last] else 0.0
    if len(rest) > 1 and is_ts[-1]:  # a lone closing timestamp: the segment is complete
        segments.append(segment(rest, start, time(rest[-1])))
        return segments, len(segments)
    segments.append(segment(rest, start, duration))  # open: the window ran out mid-segment
    return segments, len(segments) - 1


def _sureness(word: dict) -> float | None:
    """A word's probability with its punctuation's where the timing gave it, else its own."""
    return word.get("probability_with_marks", word.get("probability"))


def hypothesis_from_segments(segments: list[dict], closed: int) -> Hypothesis:
    """Words of segments that carry ``words`` (openai-whisper's shape); the first ``closed`` are complete.
    A word's probability is its ``probability_with_marks`` where the timing gave one."""
    words = [
        Word(w["word"], float(w["start"]), float(w["end"]), _sureness(w))
        for s in segments
        for w in s.get("words", [])
    ]
    counts, total = [], 0
    for s in segments[:closed]:
        total += len(s.get("words", []))
        counts.append(total)
    return Hypothesis(words, [float(s["end"]) for s in segments[:closed]], counts)
