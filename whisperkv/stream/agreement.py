"""LocalAgreement-2: a word is final once two consecutive hypotheses agree on it and on all before it
(three where the hypothesis before those two read the same audio as other words: ``_contested``).

Each update re-transcribes the whole audio buffer, which still holds audio of words already committed.
So a new hypothesis is first stripped of its leading words that are already committed (as many as the
buffer holds committed words, where the hypothesis repeats the committed tail there; else judged by
time and text); then the longest common prefix of the previous and the new remainder, compared word by
word on normalised text, is committed. Committed words are never retracted: the list only grows, and
its times never go back (a word's start is clamped to the end of the word before it).

The committed words still heard in the buffer (``first_in_buffer``, kept by the session) are what a
hypothesis is aligned with: "word word word" said three times is three words, not a re-hearing.

With ``confident`` set, a word is also final at its first hearing when the model gave it at least that
probability (and the punctuation attached to it: "country." is only as sure as its full stop), it ends
``CONFIDENT_MARGIN_S`` before the audio decoded (a word reaching the end may still be being said) and a
word after it was heard too (what follows decides its punctuation, "country" or "country."; and a run
the model invents at the end of the audio is not taken word by word; where that word reaches the end
itself, ``SURE_BEFORE_CUT`` is asked of the one before it) and it does not repeat the word
before it (repeats are where the model loops), as are the words before it: its latency is then what is
left of the chunk after it, not a chunk more. Off by default.

``settled`` says how many leading words of the last hypothesis are committed after the update and were
heard twice (a word final at its first hearing counts once it is heard again): the session cuts its
buffer only at a segment end within them, so audio leaves the buffer only once every word heard in it is
committed. ``final`` counts every committed one (``settled`` and the words final at their first hearing
after them): those after a cut are still heard in the buffer.
"""

from __future__ import annotations

from whisperkv.metrics import normalize_text
from whisperkv.stream.events import Word

#: a hypothesis word that starts this much before the last committed end still counts as new (timing jitter)
TIME_TOLERANCE = 0.1
#: longest committed tail compared with a hypothesis at the seam
MAX_SEAM_NGRAM = 5
#: a word repeating the committed end is its re-hearing only if it ends within this of it (seconds)
SEAM_WINDOW = 1.0
#: a word left as new may start this much before the committed end (the heads' jitter), not more
COUNT_SLACK = 0.4
#: how many words either side of the count by time a re-hearing of the committed end is looked for
SEARCH = 2
#: a word committed at its first hearing ends at least this long before the audio decoded (seconds)
CONFIDENT_MARGIN_S = 0.1
#: a word followed only by one that reaches the audio's end is final at its first hearing at this probability
SURE_BEFORE_CUT = 0.8
#: where two hearings that part may meet again: (words of the new one, words of the previous one) between
#: the parting and the next word they share, narrowest first
RESYNC = sorted(((n, b) for n in range(1, 4) for b in range(1, 4)), key=lambda nb: (max(nb), sum(nb)))
#: a word two hearings share after parting is the same word if they date it this close (seconds)
RESYNC_S = 0.5
#: a word dated this long or longer (seconds), with a word heard after it, may hide skipped speech
LONGEST_WORD_S = 3.0
#: a stretch with no word heard this long (seconds) just before such a word may be where the skip began
QUIET_S = 2.0


def stretched(words: list[Word], i: int) -> bool:
    """Whether ``words[i]`` may hide skipped speech: dated ``LONGEST_WORD_S`` or longer, a word after it."""
    return words[i].end - words[i].start >= LONGEST_WORD_S and i + 1 < len(words)


def skip_start(words: list[Word], i: int) -> int:
    """The first word that may lie in the speech a ``stretched`` ``words[i]`` hides: ``i``, or the first
    word after a stretch of ``QUIET_S`` with no word heard that ends less than ``LONGEST_WORD_S`` before it.
    The utterances file without a VAD at 3 s per update read "thanks.[-103.08] For[106.86-107.68]
    although[107.68-110.74]" from buffers starting 10 s before: "For" dated into "She had your dark suit in
    greasy wash water all year.", which those hearings skipped; committed, it was taken for the "for" of
    "wash for all year" when a nearer buffer heard the sentence, and the sentence was lost."""
    for j in range(i, 0, -1):
        if words[i].start - words[j].start >= LONGEST_WORD_S:
            break
        if words[j].start - words[j - 1].end >= QUIET_S:
            return j
    return i


class Continuation(Word):
    """The end of the last committed word, heard later (its text has no leading space): "13." after a
    committed " 18". Committed, it lengthens that word, so the committed words stay one per word heard."""


def word_key(text: str) -> str:
    """A word as compared: normalised (Whisper's English normaliser), letters and digits only, so that
    "so..." and "so" agree whatever the normaliser leaves of the punctuation."""
    normal = normalize_text(text)
    return "".join(c for c in normal if c.isalnum()) or normal


def same_word(a: Word, b: Word) -> bool:
    return word_key(a.text) == word_key(b.text)


class LocalAgreement:
    def __init__(self, confident: float | None = None) -> None:
        self.confident = confident  # the probability that commits a word at its first hearing; None: off
        self.committed: list[Word] = []
        self.previous: list[Word] = []  # the last hypothesis minus what was committed
        self.hearings: list[int] = []  # of each word in ``previous``: hearings in a row that said it
        self.needed: list[int] = []  # of each word in ``previous``: hearings it needs (2, or 3: contested)
        self.settled = 0  # leading words of the last hypothesis that are committed and heard twice
        self.final = 0  # leading words of the last hypothesis that are committed
        self.unagreed = 0  # updates in a row that committed nothing while words were pending
        #: where the last hypothesis has a word that may hide skipped speech, not committed (``_skipping``)
        self.skipping: Word | None = None
        self.skip_from = 0.0  # where the words held with ``skipping`` begin (seconds)
        self.long_heard_to = 0.0  # a long word before this (seconds) was heard again: it is taken as is
        self.first_in_buffer = 0  # committed words before this one are the prompt's, heard no more
        #: the buffer holds no committed word's audio (set by the session: a new utterance whose speech
        #: starts after the last one's ended, nothing committed or cut since)
        self.fresh = False

    @property
    def last_end(self) -> float:
        return self.committed[-1].end if self.committed else 0.0

    @property
    def settled_end(self) -> float:
        """Where the last committed word heard twice ends (the committed words after it, ``final`` past
        ``settled``, were final at their first hearing); 0.0 when there is none."""
        settled = len(self.committed) - (self.final - self.settled)
        return self.committed[settled - 1].end if settled > 0 else 0.0

    def already_committed(self, hypothesis: list[Word]) -> int:
        """How many leading words of ``hypothesis`` are re-hearings of committed words.

        By count first: the buffer holds ``first_in_buffer``..end of the committed words, and a
        hypothesis usually hears them again one for one; it does if its word at that count repeats the
        committed tail (two words where there are two). Else by time and text: near the count of words
        starting before the committed end, the word that repeats the committed tail (two words if it
        can, then the nearest) — the alignment heads move a word by a tenth of a second or more between
        decodes ("what" starting 0.12 s before the committed "not" ended was once skipped, and lost), so
        time alone is the last resort. A count that leaves a "new" word starting well inside the
        committed audio is refused (a model looping "Word. Word. ..." over committed speech repeats the
        committed tail anywhere: counting alone would commit every loop).
        """
        if not self.committed:
            return 0
        carried = len(self.committed) - self.first_in_buffer
        last = self.last_end
        if carried == 0 and self.fresh:  # nothing committed is heard again: "word" at the start of the
            return 0  # utterance after "... word. Word." is a new word (mfa_words lost two so)

        def plausible(k: int) -> bool:  # the first word left as new does not start inside committed audio
            return k >= len(hypothesis) or hypothesis[k].start > last - COUNT_SLACK

        if 0 < carried <= len(hypothesis) and self._tail_match(hypothesis, carried - 1) >= min(2, carried):
            if plausible(carried):
                return carried
        by_time = 0
        while by_time < len(hypothesis) and hypothesis[by_time].start <= last - TIME_TOLERANCE:
            by_time += 1
        best: tuple[tuple[int, int], int] | None = None
        for j in range(max(0, by_time - 1 - SEARCH), min(len(hypothesis), by_time + SEARCH, carried + 1)):
            if abs(hypothesis[j].end - last) > SEAM_WINDOW or not plausible(j + 1):
                continue
            n = self._tail_match(hypothesis, j)
            key = (min(n, 2), -abs(j - (by_time - 1)))
            if n and (best is None or key > best[0]):
                best = (key, j)
        if best is not None:
            return best[1] + 1
        # by time alone only where the buffer holds committed words: with none carried, a word that the
        # heads date a little before the committed end but that does not repeat it is new ("for" after
        # a committed "do" whose end was dated 0.15 s late was once skipped, and lost)
        return by_time if carried > 0 else 0

    def _tail_match(self, hypothesis: list[Word], j: int) -> int:
        """How many committed words, from the last back, ``hypothesis[: j + 1]`` ends with."""
        n = 0
        while n <= j and n < min(len(self.committed), MAX_SEAM_NGRAM):
            if not same_word(hypothesis[j - n], self.committed[-1 - n]):
                break
            n += 1
        return n

    def _sure_at_once(self, new: list[Word], i: int, heard_end: float | None) -> bool:
        """Whether ``new[i]`` is final without a second hearing (``confident``). A word after it must
        have been heard; where that one reaches the audio's end (ends within ``CONFIDENT_MARGIN_S`` of
        it: cut off, perhaps), the word needs ``SURE_BEFORE_CUT`` — what little was heard after it says
        little of where it ends: "compared" (0.69) then "to..." at the end of 1 s of "comparatively",
        "began to" (0.61) then "confuse." for "began a confused". A word that repeats the one before it
        waits for the second hearing: repeats are where the model loops and where a re-hearing is
        hardest to tell from a new word (mfa_words' "word. Word. Word." committed at once made a prompt
        of repeats, and the next utterance was heard as six "Word."s: eleven "word"s in all where the
        clip says seven)."""
        word = new[i]
        if self.confident is None or heard_end is None or word.probability is None:
            return False
        if i + 1 >= len(new):
            return False
        if new[i + 1].end > heard_end - CONFIDENT_MARGIN_S and word.probability < SURE_BEFORE_CUT:
            return False
        before = new[i - 1] if i else (self.committed[-1] if self.committed else None)
        if before is not None and same_word(before, word):
            return False
        return word.probability >= self.confident and word.end <= heard_end - CONFIDENT_MARGIN_S

    def _continuation(self, hypothesis: list[Word], skip: int) -> Continuation | None:
        """What ``hypothesis`` adds to the last committed word where it hears it as a longer word: a word
        split by the tokenizer, committed before its end was heard (" 18" of " 1813.", " wood" of
        " woodcutters"). Counted as a re-hearing of " 18", " 1813." added nothing, and lj002-0020's
        "in 1813" was committed as "in 18". None where the committed word ends in punctuation (it was
        heard whole), the longer word only adds punctuation, or the two are not dated alike."""
        if not skip or skip > len(hypothesis) or len(self.committed) <= self.first_in_buffer:
            return None
        heard, last = hypothesis[skip - 1], self.committed[-1]
        longer, word = heard.text.strip(), last.text.strip()
        if not word or not word[-1].isalnum() or len(longer) <= len(word) or not longer.startswith(word):
            return None
        rest = longer[len(word) :]
        if not (rest[0].isalnum() or rest[0] in "-'") or abs(heard.start - last.start) > RESYNC_S:
            return None
        return Continuation(rest, last.end, max(heard.end, last.end), heard.probability)

    def _unseen(self, hypothesis: list[Word]) -> tuple[list[Word], int]:
        """The part of ``hypothesis`` not already committed (led by a ``Continuation`` of the last
        committed word where it has one), and how many of its leading words are committed whole."""
        skip = self.already_committed(hypothesis)
        continuation = self._continuation(hypothesis, skip)
        if continuation is None:
            return list(hypothesis[skip:]), skip
        return [continuation, *hypothesis[skip:]], skip - 1

    def unseen(self, hypothesis: list[Word]) -> list[Word]:
        """The part of ``hypothesis`` that is not already committed."""
        return self._unseen(hypothesis)[0]

    def update(self, hypothesis: list[Word], heard_end: float | None = None) -> list[Word]:
        """Take a new hypothesis of the audio up to ``heard_end``; return the words it commits (the agreed
        prefix with the previous one, then the confident words after it where ``confident`` is set)."""
        new, skip = self._unseen(hypothesis)
        agreed = 0
        while agreed < min(len(new), len(self.previous)) and same_word(new[agreed], self.previous[agreed]):
            agreed += 1
        hearings, needed = self._count_hearings(new, agreed)
        final = 0
        while final < agreed and hearings[final] >= needed[final]:
            final += 1
        settled = final
        if final == agreed:  # no word heard twice waits for a third hearing before these
            while final < len(new) and needed[final] == 2 and self._sure_at_once(new, final, heard_end):
                final += 1
        held = self._skipping(new, final)
        final, settled = min(final, held), min(settled, held)
        commit = self._extend(new[:final])
        self.previous = list(new[final:])
        self.hearings, self.needed = hearings[final:], needed[final:]
        # the buffer is cut only after words heard twice: a word final at its first hearing may sit at
        # the end of the audio heard, where the next word's start is least sure (a cut there, before an
        # "ask" heard for 0.2 s, lost jfk's "ask what you can do for your" at 1.5 s per update)
        self.settled, self.final = skip + settled, skip + final
        self.unagreed = 0 if commit or not self.previous else self.unagreed + 1
        return commit

    def _skipping(self, new: list[Word], final: int) -> int:
        """How many of the ``final`` words are committed: those before the first word that may hide skipped
        speech (dated ``LONGEST_WORD_S`` or more with a word heard after it, not heard again already:
        ``long_heard_to``) and the words that may lie in that speech (``skip_start``). Where that word is
        final, it is ``skipping`` and ``skip_from`` is where the held words begin. The sonnets without a
        VAD at 5 s per update read "warm and[104.70-112.94] thou", skipping "feel'st it cold. Look in thy
        glass and tell the face", and two hearings agreed on it."""
        self.skipping = None
        i = self.long_word(new)
        if i is None:
            return final
        held = skip_start(new, i)
        if i < final:
            self.skipping, self.skip_from = new[i], new[held].start
        return min(held, final)

    def long_word(self, new: list[Word]) -> int | None:
        """The first of ``new`` that may hide skipped speech (``stretched``) and was not heard again
        already (``long_heard_to``); None if none."""
        longs = (i for i in range(len(new)) if stretched(new, i) and new[i].start >= self.long_heard_to)
        return next(longs, None)

    def _count_hearings(self, new: list[Word], agreed: int) -> tuple[list[int], list[int]]:
        """For each word of ``new``: how many hearings in a row have agreed on it, and how many it needs:
        two, or three for the words of a contested span (``_contested``)."""
        hearings = [h + 1 for h in self.hearings[:agreed]] + [1] * (len(new) - agreed)
        needed = self.needed[:agreed] + [2] * (len(new) - agreed)
        for i in range(agreed, agreed + self._contested(new, agreed)):
            needed[i] = 3
        return hearings, needed

    def _contested(self, new: list[Word], agreed: int) -> int:
        """How many words of ``new`` from ``agreed`` on read differently what the previous hearing read,
        between words the two agree on: both heard what followed, so the difference is the model's doubt,
        not a word cut off at the end of less audio (the usual way two hearings part). The next two
        hearings may then agree on a guess: lj001 read "the one the whole", then "they'll want the whole"
        twice (committed), then "though on the whole" ever after. 0 where the two part only at the
        previous one's end, where one word is spelt another way ("tilage", "tillage") with the next word
        the same (the readings agree on where the words are), or where one has a word more."""
        before = self.previous
        for width_new, width_before in RESYNC:
            j, i = agreed + width_new, agreed + width_before
            if j < len(new) and i < len(before) and same_word(new[j], before[i]):
                if abs(new[j].start - before[i].start) > RESYNC_S:
                    continue
                if width_new == width_before == 1:
                    return 0
                # a word of one reading in the other's is one reading with a word more ("a long" and
                # "long": also a committed word heard again but not recognised as such), not two readings
                shared = any(same_word(n, b) for n in new[agreed:j] for b in before[agreed:i])
                return 0 if shared else width_new
        return 0

    def flush(self, hypothesis: list[Word] | None = None, before: float | None = None) -> list[Word]:
        """Commit everything not yet committed: of ``hypothesis`` when given, else of the last one; only
        the words that end before ``before`` when given (the rest is heard again)."""
        rest = self.unseen(hypothesis) if hypothesis is not None else self.previous
        if before is not None:
            rest = [w for w in rest if w.end < before]
        self.forget_pending()
        return self._extend(rest)

    def forget_pending(self) -> None:
        """Drop the last hypothesis's words not committed (their audio is not heard again)."""
        self.previous, self.hearings, self.needed = [], [], []
        self.settled = self.final = self.unagreed = 0

    def _extend(self, words: list[Word]) -> list[Word]:
        """Append ``words``, each starting no earlier than the committed end (times only move forward); a
        ``Continuation`` lengthens the last committed word instead (and is returned as what was added)."""
        out = []
        for w in words:
            if isinstance(w, Continuation):
                last = self.committed[-1]
                self.committed[-1] = Word(last.text + w.text, last.start, w.end, last.probability)
                out.append(w)
                continue
            start = max(w.start, self.last_end)
            word = w if start == w.start else Word(w.text, start, max(w.end, start), w.probability)
            self.committed.append(word)
            out.append(word)
        return out

    def committed_text(self) -> str:
        return "".join(w.text for w in self.committed).strip()
