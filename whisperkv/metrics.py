"""Word error rate as the field computes it: Whisper's English normaliser, then jiwer's word alignment.

Both sides go through openai-whisper's ``EnglishTextNormalizer`` rules (``whisperkv.normalizers``), so a
figure printed here is comparable with the Whisper paper's and with any peer's measured the same way.
A corpus WER is the sum of the edits over the sum of the reference words (``word_errors`` per clip).
"""

from __future__ import annotations

from functools import lru_cache

import jiwer

from whisperkv.normalizers import EnglishTextNormalizer


@lru_cache(maxsize=1)
def english_normalizer() -> EnglishTextNormalizer:
    """One normaliser per process: building one compiles its rules and reads the spelling table."""
    return EnglishTextNormalizer()


def normalize_text(text: str) -> str:
    """Whisper's English normalisation: lower case, numbers as digits, American spelling, no symbols."""
    return english_normalizer()(text)


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edits, reference words) after normalisation; WER = edits / words, summed over a corpus."""
    ref, hyp = normalize_text(reference), normalize_text(hypothesis)
    alignment = jiwer.process_words(ref, hyp)
    edits = alignment.substitutions + alignment.deletions + alignment.insertions
    return edits, len(ref.split())


def wer(reference: str, hypothesis: str) -> float:
    """One clip's WER; a reference with no words counts every hypothesis word as an error."""
    errors, words = word_errors(reference, hypothesis)
    return errors / max(words, 1)
