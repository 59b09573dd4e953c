"""The English normaliser of the Whisper paper: numbers, spellings and contractions made uniform.

Numbers and British spellings come from ``whisper-normalizer`` unchanged (they equal openai-whisper's).
Its ``EnglishTextNormalizer`` expands four informal words that openai-whisper's does not ("kinda",
"sorta", "dunno", "cause"); a WER comparable with the paper's and with every peer's needs the
reference's rules exactly, so those four are taken out again here.
"""

from __future__ import annotations

from whisper_normalizer.english import EnglishNumberNormalizer, EnglishSpellingNormalizer
from whisper_normalizer.english import EnglishTextNormalizer as _PackagedEnglishTextNormalizer

__all__ = ["EnglishNumberNormalizer", "EnglishSpellingNormalizer", "EnglishTextNormalizer"]

#: replacements ``whisper-normalizer`` added (0.1.x) that openai-whisper's normaliser does not make
NOT_IN_REFERENCE = (r"\bkinda\b", r"\bsorta\b", r"\bdunno\b", r"\bcause\b")


class EnglishTextNormalizer(_PackagedEnglishTextNormalizer):
    """``EnglishTextNormalizer()("Mr. Park's 2 cents")`` → ``"mister park is ¢2"``, as openai-whisper's."""

    def __init__(self) -> None:
        super().__init__()
        self.replacers = {
            pattern: value for pattern, value in self.replacers.items() if pattern not in NOT_IN_REFERENCE
        }
