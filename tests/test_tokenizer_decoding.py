"""Tokenizer tests, part two: suppression, timestamps, decoding, the language tables, word splitting.

The same tokenizer.json files and reference tokenizer as tests/test_tokenizer.py (whose fixtures these
tests use): the suppression sets must agree with the reference's and CTranslate2's, timestamps render
as the reference renders them, and words split into the reference's groups of tokens.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests import test_tokenizer
from tests.conftest import require_oracle
from tests.test_tokenizer import _english_model_dir, _multilingual_model_dir
from whisperkv.tokenizer import LANGUAGES, NUM_TIMESTAMP_TOKENS, TO_LANGUAGE_CODE, Tokenizer, get_tokenizer

# test_tokenizer.py's module fixtures (the model kind, its files, our tokenizer, the reference's), seen
# by pytest under their own names here; bound by assignment so a test's argument does not read as a
# redefinition of an import
kind = test_tokenizer.kind
model_dir = test_tokenizer.model_dir
tok = test_tokenizer.tok
ref = test_tokenizer.ref


@pytest.fixture(scope="module")
def ct2_config(model_dir) -> dict:
    return json.loads((model_dir / "config.json").read_text())


# ---------------------------------------------------------------------------- 1. suppression


def test_default_suppress_tokens_match_ctranslate2_config(tok, ct2_config):
    # Two independent derivations: ours from the symbol rule, CTranslate2's from its converter.
    assert list(tok.default_suppress_tokens()) == ct2_config["suppress_ids"]
    assert ct2_config["suppress_ids_begin"] == [tok.encode(" ")[0], tok.eot]


@pytest.mark.oracle
def test_suppress_tokens_match_reference(tok, ref):
    decoding = require_oracle("whisper.decoding")
    assert tok.non_speech_tokens == ref.non_speech_tokens
    task = SimpleNamespace(options=SimpleNamespace(suppress_tokens="-1"), tokenizer=ref)
    assert tok.default_suppress_tokens() == decoding.DecodingTask._get_suppress_tokens(task)


def test_non_speech_tokens_keep_plain_punctuation(tok):
    suppressed = set(tok.non_speech_tokens)
    for allowed in (",", ".", "?", "!", "-", "'", " Hello"):
        assert tok.encode(allowed)[0] not in suppressed, allowed
    for banned in (" -", " '", " [", "(", "♪", " ♪"):
        assert tok.encode(banned)[0] in suppressed, banned


# ---------------------------------------------------------------------------- 2. timestamps


def test_timestamp_tokens(tok):
    timestamps = [t for t in range(tok.vocab_size) if tok.is_timestamp(t)]
    assert len(timestamps) == NUM_TIMESTAMP_TOKENS
    assert timestamps[0] == tok.timestamp_begin and timestamps[-1] == tok.vocab_size - 1
    assert tok.timestamp_seconds(timestamps[0]) == 0.0
    assert tok.timestamp_seconds(timestamps[-1]) == 30.0
    assert tok.timestamp_seconds(tok.timestamp_begin + 54) == 1.08
    assert not tok.is_timestamp(tok.no_timestamps)
    with pytest.raises(ValueError):
        tok.timestamp_seconds(tok.eot)

    text = tok.encode(" Hello world.")
    ids = [timestamps[0], *text, timestamps[-1]]
    assert tok.decode_with_timestamps(ids) == "<|0.00|> Hello world.<|30.00|>"
    assert tok.decode(ids) == " Hello world."


@pytest.mark.oracle
def test_timestamp_rendering_matches_reference(tok, ref):
    begin = tok.timestamp_begin
    for step in range(NUM_TIMESTAMP_TOKENS):
        assert tok.decode_with_timestamps([begin + step]) == ref.decode_with_timestamps([begin + step])
    ids = [*tok.sot_sequence_including_notimestamps, begin, *tok.encode(" 日本語 ok"), begin + 54, tok.eot]
    assert tok.decode_with_timestamps(ids) == ref.decode_with_timestamps(ids)


# ---------------------------------------------------------------------------- 3. decoding, languages


def test_decode_drops_specials(tok):
    text = " Ein Test, 日本語."
    ids = [
        tok.sot_prev,
        *tok.encode(" context"),
        *tok.sot_sequence,
        tok.language_token("de"),
        tok.no_timestamps,
        tok.no_speech,
        tok.timestamp_begin,
        *tok.encode(text),
        tok.timestamp_begin + 100,
        tok.sot_lm,
        tok.eot,
    ]
    assert tok.decode(ids) == " context" + text
    assert tok.decode_bytes(ids) == (" context" + text).encode("utf-8")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError):
        tok.decode([-1])


def test_decode_partial_characters_become_replacement(tok):
    ids = tok.encode("鑫")  # a rare CJK character: three byte tokens in both vocabularies
    assert len(ids) == 3
    assert tok.decode(ids[:2]) == "\ufffd"
    assert tok.decode(ids) == "鑫"
    assert b"".join(tok.token_bytes(t) for t in ids) == "鑫".encode()


def test_languages_of_multilingual_file():
    tok = get_tokenizer(_multilingual_model_dir())
    assert len(tok.all_language_codes) == 99
    assert list(tok.all_language_codes) == list(LANGUAGES)[:99]
    assert tok.all_language_tokens == tuple(range(tok.sot + 1, tok.sot + 100))
    assert tok.all_language_tokens[-1] + 1 == tok.translate


def test_every_model_has_the_first_99_languages(tok):
    # tiny.en's file spells Hebrew with the retired code <|iw|>; it must still count as "he".
    assert tok.all_language_codes == tuple(LANGUAGES)[:99]
    assert tok.language_token("he") == tok.language_token("hebrew") == tok.sot + 1 + 20
    assert tok.decode_with_timestamps([tok.language_token("he")]) in ("<|he|>", "<|iw|>")


def test_language_tables():
    assert len(LANGUAGES) == 100
    assert list(LANGUAGES)[:8] == ["en", "zh", "de", "es", "ru", "ko", "fr", "ja"]
    assert list(LANGUAGES)[-2:] == ["su", "yue"]
    assert all(TO_LANGUAGE_CODE[name] == code for code, name in LANGUAGES.items())
    assert TO_LANGUAGE_CODE["mandarin"] == "zh" and TO_LANGUAGE_CODE["burmese"] == "my"


# ---------------------------------------------------------------------------- 4. word splitting

WORD_CASES = [
    ("en", " Hello, world! It's a test-case."),
    ("en", " The quick brown fox (laughs) said 42 things..."),
    ("de", " Größenwahn ist überall, oder?"),
    ("ru", " Привет, как дела?"),
    ("ja", "日本語のテキストです。カタカナ"),
    ("zh", "你好，世界！😀"),
    ("th", "สวัสดีชาวโลก"),
]


def _check_partition(tok: Tokenizer, ids: list[int], words: list[str], groups: list[list[int]]) -> None:
    assert [token for group in groups for token in group] == ids
    assert "".join(words) == tok.decode_with_timestamps(ids)
    assert len(words) == len(groups) and all(groups)


def test_split_to_word_tokens_spaced():
    tok = get_tokenizer(_english_model_dir())
    ids = tok.encode(" Hello, world! It's fine.") + [tok.eot]
    words, groups = tok.split_to_word_tokens(ids)
    assert words == [" Hello", ",", " world", "!", " It's", " fine", ".", "<|endoftext|>"]
    _check_partition(tok, ids, words, groups)


def test_split_to_word_tokens_unspaced():
    tok = get_tokenizer(_multilingual_model_dir(), language="ja")
    text = "日本語です鑫😀"
    ids = tok.encode(text)
    words, groups = tok.split_to_word_tokens(ids)
    assert words[-2:] == ["鑫", "😀"]  # characters spread over several tokens stay whole
    assert [len(group) for group in groups[-2:]] == [3, 2]
    assert all("\ufffd" not in word for word in words)
    _check_partition(tok, ids, words, groups)


@pytest.mark.oracle
@pytest.mark.parametrize(("language", "text"), WORD_CASES)
def test_split_to_word_tokens_matches_reference(kind, tok, language, text):
    wt = require_oracle("whisper.tokenizer")
    multilingual = kind == "multi"
    ref = wt.get_tokenizer(multilingual, num_languages=99, language=language)
    ours = tok.with_options(language=language) if multilingual else tok
    ids = tok.encode(text) + [tok.eot]
    words, groups = ours.split_to_word_tokens(ids)
    assert (words, groups) == ref.split_to_word_tokens(ids)
    _check_partition(tok, ids, words, groups)
