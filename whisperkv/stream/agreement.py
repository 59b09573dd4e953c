"""LocalAgreement-2: a word is final once two consecutive hypotheses agree on it and on all before it.

Each update re-transcribes the whole audio buffer, which still holds audio of words already committed.
So a new hypothesis is first stripped of what is already committed (words ending before the last
commit, and a repeated n-gram at the seam); then the longest common prefix of the previous and the new
remainder, compared word by word on normalised text, is committed. Committed words are never retracted:
the list only grows.
"""

from __future__ import annotations

from whisperkv.metrics import normalize_text
from whisperkv.stream.events import Word

#: a hypothesis word that starts this much before the last committed end still counts as new (timing jitter)
TIME_TOLERANCE = 0.1
#: longest committed tail that a new hypothesis may repeat at its start
MAX_SEAM_NGRAM = 5


def same_word(a: Word, b: Word) -> bool:
    return normalize_text(a.text) == normalize_text(b.text)


class LocalAgreement:
    def __init__(self) -> None:
        self.committed: list[Word] = []
        self.previous: list[Word] = []  # the last hypothesis minus what was committed

    @property
    def last_end(self) -> float:
        return self.committed[-1].end if self.committed else 0.0

    def unseen(self, hypothesis: list[Word]) -> list[Word]:
        """The part of ``hypothesis`` that is not already committed."""
        last = self.last_end
        new = (
            [w for w in hypothesis if w.start > last - TIME_TOLERANCE] if self.committed else list(hypothesis)
        )
        if new and self.committed and abs(new[0].start - last) < 1.0:
            for n in range(min(MAX_SEAM_NGRAM, len(new), len(self.committed)), 0, -1):
                tail = self.committed[-n:]
                if all(same_word(a, b) for a, b in zip(tail, new[:n])):
                    return new[n:]
        return new

    def update(self, hypothesis: list[Word]) -> list[Word]:
        """Take a new hypothesis; return the words it commits (the agreed prefix with the previous one)."""
        new = self.unseen(hypothesis)
        agreed = 0
        while agreed < min(len(new), len(self.previous)) and same_word(new[agreed], self.previous[agreed]):
            agreed += 1
        commit = new[:agreed]
        self.committed.extend(commit)
        self.previous = new[agreed:]
        return commit

    def flush(self, hypothesis: list[Word] | None = None) -> list[Word]:
        """Commit everything not yet committed: of ``hypothesis`` when given, else of the last one."""
        rest = self.unseen(hypothesis) if hypothesis is not None else self.previous
        self.committed.extend(rest)
        self.previous = []
        return rest

    def committed_text(self) -> str:
        return "".join(w.text for w in self.committed).strip()
