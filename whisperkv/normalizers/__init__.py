"""Whisper's text normalisers, as ``whisper.normalizers`` offers them: what WER is computed after.

The rules are the Whisper paper's (appendix C); the code is the ``whisper-normalizer`` package's, held to
openai-whisper's own normaliser string for string (``tests/test_normalizers.py``).
"""

from whisperkv.normalizers.basic import BasicTextNormalizer
from whisperkv.normalizers.english import EnglishTextNormalizer

__all__ = ["BasicTextNormalizer", "EnglishTextNormalizer"]
