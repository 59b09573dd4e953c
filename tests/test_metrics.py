"""WER: Whisper's English normaliser, then jiwer's alignment; figures checked by hand and against jiwer."""

import jiwer
import pytest

from tests.conftest import require_oracle
from whisperkv.metrics import normalize_text, wer, word_errors


def test_normalize_text_is_whispers_english_normaliser():
    assert normalize_text("Hello, World! It's  'quoted' -- forty-two.") == "hello world it is quoted 42"
    assert normalize_text("Mr. Smith paid twenty dollars, colour TV.") == "mister smith paid $20 color tv"
    reference = require_oracle("whisper.normalizers").EnglishTextNormalizer()
    for text in ("Um, the 3rd of May, uh, 1990s.", "Let's [laughs] see (inaudible) hmm"):
        assert normalize_text(text) == reference(text)


def test_word_errors_counts_substitutions_insertions_deletions():
    assert word_errors("a b c", "a b c") == (0, 3)
    assert word_errors("a b c", "a x c") == (1, 3)
    assert word_errors("a b c", "a c") == (1, 3)
    assert word_errors("a b", "a b c d") == (2, 2)
    assert word_errors("", "a b") == (2, 0)
    assert word_errors("a b c", "") == (3, 3)


def test_wer_is_relative_to_reference_length():
    assert wer("the cat sat on the mat", "The cat sat on a mat.") == 1 / 6
    assert wer("", "") == 0.0


@pytest.mark.parametrize(
    ("reference", "hypothesis"),
    [
        ("And so my fellow Americans, ask not", "and so my fellow american ask knot what"),
        ("two point five million dollars", "$2.5 million"),
        ("the colour of the harbour", "the color of harbor boats"),
    ],
)
def test_wer_equals_jiwer_on_whisper_normalised_text(reference, hypothesis):
    """The number the field would print: jiwer.wer over both sides normalised by Whisper's rules."""
    normaliser = require_oracle("whisper.normalizers").EnglishTextNormalizer()
    assert wer(reference, hypothesis) == pytest.approx(
        jiwer.wer(normaliser(reference), normaliser(hypothesis))
    )
