"""Hearing again a word long enough to hide skipped speech (issue 42).

tiny.en sometimes dates one word over seconds of speech it skipped (the sonnets without the VAD at 5 s
per update read "warm and[104.70-112.94] thou" over "feel'st it cold. 3. Look in thy glass ..."), and two
hearings of the same buffer agree on it. Such a word (``agreement.LONGEST_WORD_S``) is heard again, once,
from a buffer cut ``CONTEXT_S`` before it: by the next update (``_hear_again``), or by a close's own
nearer hearing (``_hear_nearer``). A part of ``StreamingSession``: it moves the session's buffer and
agreement as the session does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from whisperkv.audio import SAMPLE_RATE
from whisperkv.stream.agreement import skip_start
from whisperkv.stream.hypothesis import CONTEXT_S

if TYPE_CHECKING:
    from whisperkv.stream.agreement import LocalAgreement
    from whisperkv.stream.events import Event, Word
    from whisperkv.stream.hypothesis import Hypothesis


class LongWordHearing:
    """The long word's second hearing; the session's state and steps it uses, named."""

    agreement: LocalAgreement
    buffer_start: int

    def _decode(self, end: int, closing: bool = False) -> Hypothesis: ...

    def _commit(self, words: list[Word]) -> list[Event]: ...

    def _cut(self, sample: int, carried: int = 0) -> None: ...

    def _carried(self, count: int) -> int: ...

    def _hear_again(self, hypothesis: Hypothesis, long: Word) -> None:
        """A word that may hide skipped speech (``agreement.LONGEST_WORD_S``) is heard again, once, from a
        buffer cut ``CONTEXT_S`` before it where one can be: the next hearing starts near the speech the
        last ones skipped; a long word heard again is then taken as it is heard."""
        start, settled = self.buffer_start / SAMPLE_RATE, self.agreement.settled
        self.agreement.long_heard_to = long.end
        cuts = hypothesis.cuts_within(settled, start, CONTEXT_S, self.agreement.skip_from, anywhere=True)
        if cuts:
            count, cut = cuts[-1]
            self._cut(int(cut * SAMPLE_RATE), carried=self._carried(count))

    def _hear_nearer(self, last: Hypothesis, end: int) -> tuple[list[Event], Hypothesis]:
        """A close's hearing that dates a new word long enough to hide skipped speech (``stretched``), not
        heard so already, is heard again, once, from ``CONTEXT_S`` before that word, as an update's would be
        (``_hear_again``): its words before the cut are committed, the nearer hearing closes the utterance.
        A stream so slow that the end of input came before a second update had taken the skip as heard."""
        words, new, start = last.words, self.agreement.unseen(last.words), self.buffer_start / SAMPLE_RATE
        long = self.agreement.long_word(new)
        begins = new[skip_start(new, long)].start if long is not None else 0.0
        cuts = last.cuts_within(len(words), start, CONTEXT_S, begins, True) if long is not None else []
        if not cuts:
            return [], last
        self.agreement.long_heard_to = new[long].end
        (count, cut), seen = cuts[-1], len(words) - len(new)
        events = self._commit(self.agreement.flush(words[:count]))
        self._cut(int(cut * SAMPLE_RATE), carried=seen - count)
        nearer = self._decode(end, closing=True)
        return events, last if nearer.repetitive else nearer  # a loop: the words after the cut as first heard
