"""whisperkv.normalizers against openai-whisper's own normalisers, string for string.

``whisper-normalizer`` (our runtime dependency) adds four informal-word expansions the reference lacks;
``whisperkv.normalizers.english`` takes them out again. These tests hold the result to the reference on
the speech set's transcripts, hand-picked hard cases, and generated text.
"""

from __future__ import annotations

import csv

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import SPEECH_DIR, require_oracle
from whisperkv.normalizers import BasicTextNormalizer, EnglishTextNormalizer
from whisperkv.normalizers.english import (
    NOT_IN_REFERENCE,
    EnglishNumberNormalizer,
    EnglishSpellingNormalizer,
)

HARD_CASES = [
    "",
    "  ",
    "I kinda dunno, 'cause we sorta left.",
    "Mr. and Mrs. Smith's kids won't go; they've gone to St. Louis w/ Dr. Jones Jr.",
    "It's $1,234.56 - or about twenty three thousand and five hundred euros (roughly).",
    "The 1990s, the nineteen eighties and the twenty first century; 3rd, 22nd, 101st.",
    "one triple oh one, double zero seven, nine double one, two point five million",
    "Hmm, um, uh... mhm [laughter] (coughs) <unk> I'm gonna wanna gotta",
    "The colour of the theatre's programme was grey; organise the catalogue!",
    "€52.4 million, £77 thousands, ¥100, 3 cents, $0.36, 90 percent, 76 per cent",
    "Café naïve résumé — “quoted” ‘text’ and C'est la vie, l'été à Paris.",
    "b747 RC232 10km 10 th 5th minus 500 positive twenty thousand",
    "Let's see: he's like, she's been like, they'd been, it's got, y'all ain't ma'am",
    "Ünïcödé ß ﬁ ligatures Ⅻ ½ ¼ ³ and full-width ＡＢＣ１２３",
    "Don’t stop — can’t won’t shouldn’t’ve",
    "twenty nineteen july third twenty twenty and august twenty sixth twenty twenty one",
]

WORDS = [
    "one", "two", "three", "twenty", "thirty", "hundred", "thousand", "million", "billion", "point",
    "and", "a", "half", "double", "triple", "oh", "zero", "first", "second", "third", "fifties",
    "dollars", "cents", "euros", "pounds", "percent", "per", "cent", "minus", "plus", "positive",
    "colour", "favourite", "mr", "mrs", "dr", "st", "jr", "it's", "won't", "can't", "let's", "he'd",
    "um", "uh", "hmm", "kinda", "cause", "$", "£", "€", "%", ".", ",", "-", "'", "(", ")", "[", "]",
    "1", "2", "10", "3.5", "1,000", "2nd", "1990s", "km", "mm", "é", "ü", "—", "’",
]  # fmt: skip


def _manifest_references() -> list[str]:
    manifest = SPEECH_DIR / "manifest.tsv"
    if not manifest.is_file():
        return []
    with open(manifest, encoding="utf-8", newline="") as handle:
        return [row["reference"] for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]


@pytest.fixture(scope="module")
def reference():
    return require_oracle("whisper.normalizers")


@pytest.fixture(scope="module")
def reference_english(reference):
    return reference.EnglishTextNormalizer()


def test_every_speech_set_transcript_normalises_as_the_reference(reference_english):
    texts = _manifest_references()
    assert len(texts) >= 40  # the speech set is there, not silently empty
    ours = EnglishTextNormalizer()
    assert [ours(t) for t in texts] == [reference_english(t) for t in texts]


@pytest.mark.parametrize("text", HARD_CASES)
def test_hard_cases_normalise_as_the_reference(reference, reference_english, text):
    assert EnglishTextNormalizer()(text) == reference_english(text)
    assert BasicTextNormalizer()(text) == reference.BasicTextNormalizer()(text)
    assert BasicTextNormalizer(remove_diacritics=True, split_letters=True)(text) == (
        reference.BasicTextNormalizer(remove_diacritics=True, split_letters=True)(text)
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(WORDS) | st.text(max_size=6), max_size=14))
def test_generated_text_normalises_as_the_reference(reference_english, words):
    text = " ".join(words)
    assert EnglishTextNormalizer()(text) == reference_english(text)


def test_the_packages_extra_expansions_are_gone(reference_english):
    """The one place whisper-normalizer differs: its informal words stay as the reference leaves them."""
    assert len(NOT_IN_REFERENCE) == 4
    text = "i kinda dunno cause we sorta left"
    assert EnglishTextNormalizer()(text) == text == reference_english(text)


def test_number_and_spelling_normalisers_are_the_references(reference):
    english = require_oracle("whisper.normalizers.english")
    for text in ("two point five million dollars", "nineteen fifties", "one triple oh one", "$0.36"):
        assert EnglishNumberNormalizer()(text) == english.EnglishNumberNormalizer()(text)
    assert EnglishSpellingNormalizer()("mobilisation colour") == "mobilization color"
