"""The language-neutral normaliser: brackets dropped, symbols and punctuation to spaces, lower case.

``whisper-normalizer``'s module, whose defaults behave as openai-whisper's ``normalizers/basic.py``.
"""

from whisper_normalizer.basic import BasicTextNormalizer, remove_symbols, remove_symbols_and_diacritics

__all__ = ["BasicTextNormalizer", "remove_symbols", "remove_symbols_and_diacritics"]
