"""Word error rate, with the light normalisation needed to compare against reference transcripts."""

from __future__ import annotations

import re
import unicodedata

_PUNCT = re.compile(r"[^\w\s']|_")


def normalize_text(text: str) -> str:
    """Lower-case, drop punctuation (keeping in-word apostrophes), hyphens to spaces, collapse spaces."""
    text = unicodedata.normalize("NFKC", text).lower().replace("-", " ")
    text = _PUNCT.sub(" ", text)
    text = re.sub(r"(?<!\w)'|'(?!\w)", " ", text)
    return " ".join(text.split())


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance between two word lists (substitutions, insertions, deletions)."""
    previous = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        current = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (r != h))
        previous = current
    return previous[-1]


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edits, reference words) after normalisation; WER = edits / words, summed over a corpus."""
    ref, hyp = normalize_text(reference).split(), normalize_text(hypothesis).split()
    return edit_distance(ref, hyp), len(ref)


def wer(reference: str, hypothesis: str) -> float:
    errors, words = word_errors(reference, hypothesis)
    return errors / max(words, 1)
