"""Whisper's tokenizer: text <-> token ids, and the special tokens that steer decoding.

The vocabulary is a Hugging Face ``tokenizer.json`` read by ``bpe.py`` (no ``tokenizers``/``tiktoken``
dependency, so the path from text to ids is short, inspectable and tested against the reference).
Timestamp tokens are not listed in the file: they follow ``<|notimestamps|>`` directly, 1501 tokens for
0.00 s … 30.00 s in 0.02 s steps. ``LANGUAGES`` and ``TO_LANGUAGE_CODE`` are re-exported from
``languages.py``, where openai-whisper's API has them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property
from os import PathLike
from pathlib import Path
from types import EllipsisType

from whisperkv.bpe import PRETOKENIZE, Vocabulary, open_vocabulary
from whisperkv.errors import ModelLoadError, TokenizerOptionError
from whisperkv.languages import LANGUAGES, TO_LANGUAGE_CODE, normalize_language
from whisperkv.non_speech import non_speech_token_ids
from whisperkv.word_split import split_on_characters, split_on_spaces

__all__ = ["LANGUAGES", "TO_LANGUAGE_CODE", "Tokenizer", "TokenizerOptionError", "get_tokenizer"]

NUM_TIMESTAMP_TOKENS = 1501  # 0.00 s .. 30.00 s inclusive
SECONDS_PER_TIMESTAMP = 0.02
TASKS = ("transcribe", "translate")

# The English-only (GPT-2) vocabulary has 50256 BPE tokens before <|endoftext|>; the multilingual one
# has 50257. That id is the cleanest single fact that tells the two vocabularies apart.
_GPT2_EOT = 50256

# Languages written without spaces between words: word boundaries fall on character boundaries.
_UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})


def _format_timestamp(step: int) -> str:
    # Integer arithmetic so "<|1.08|>" never comes out as "<|1.0799999|>".
    hundredths = step * 2
    return f"<|{hundredths // 100}.{hundredths % 100:02d}|>"


class Tokenizer:
    """Text <-> token ids for one Whisper model, plus the special tokens that steer decoding.

    ``language`` and ``task`` only affect :attr:`sot_sequence` (the decoder prompt) and word
    splitting; encoding and decoding of text are the same for every setting.
    """

    def __init__(
        self,
        vocabulary: Vocabulary,
        *,
        multilingual: bool,
        language: str | None = None,
        task: str | None = None,
    ) -> None:
        self._vocab = vocabulary
        self.multilingual = multilingual
        if task is not None and task not in TASKS:
            raise TokenizerOptionError(f"unknown task {task!r}; expected one of {TASKS}")
        if language is not None:
            language = normalize_language(language)
            if language not in vocabulary.languages:
                raise TokenizerOptionError(
                    f"language {language!r} ({LANGUAGES[language]}) is not in this model's vocabulary"
                )
        if multilingual:
            self.language = language
            self.task = task or "transcribe"
        else:
            # English-only models are never prompted with language or task tokens; they only transcribe
            # English, so say so instead of silently ignoring a different request.
            if language not in (None, "en"):
                raise TokenizerOptionError(f"English-only model cannot transcribe language {language!r}")
            if task == "translate":
                raise TokenizerOptionError("English-only model cannot translate")
            self.language = "en"
            self.task = "transcribe"

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        *,
        multilingual: bool | None = None,
        language: str | None = None,
        task: str | None = None,
        num_languages: int | None = None,
    ) -> Tokenizer:
        """Load a tokenizer.json (or a model directory holding one).

        ``multilingual`` and ``num_languages`` are read from the file; passing them checks that the file
        matches the model weights it will be used with, catching a mismatched pair early.
        """
        vocabulary = open_vocabulary(path)
        is_multilingual = vocabulary.eot != _GPT2_EOT
        if multilingual is not None and multilingual != is_multilingual:
            kind = "multilingual" if is_multilingual else "English-only"
            raise ModelLoadError(
                f"{vocabulary.path}: is a {kind} vocabulary, but multilingual={multilingual}"
            )
        tokenizer = cls(vocabulary, multilingual=is_multilingual, language=language, task=task)
        if num_languages is not None and num_languages != len(tokenizer.all_language_codes):
            raise ModelLoadError(
                f"{vocabulary.path}: has {len(tokenizer.all_language_codes)} language tokens, "
                f"but the model expects {num_languages}"
            )
        return tokenizer

    def with_options(
        self,
        *,
        language: str | None | EllipsisType = ...,
        task: str | None | EllipsisType = ...,
    ) -> Tokenizer:
        """A tokenizer sharing this vocabulary with another language and/or task (``...`` = keep).

        Useful once language detection has run: the vocabulary is not read again.
        """
        if language is ...:
            language = self.language if self.multilingual else None
        if task is ...:
            task = self.task
        return Tokenizer(self._vocab, multilingual=self.multilingual, language=language, task=task)

    def __repr__(self) -> str:
        kind = "multilingual" if self.multilingual else "English-only"
        return f"Tokenizer({kind}, language={self.language!r}, task={self.task!r}, path={str(self.path)!r})"

    @property
    def path(self) -> Path:
        """The tokenizer.json this vocabulary came from."""
        return self._vocab.path

    # ------------------------------------------------------------------ text <-> ids

    def encode(self, text: str) -> list[int]:
        """Encode text as BPE tokens. Special-token spellings like "<|en|>" are treated as plain text."""
        ids: list[int] = []
        for piece in PRETOKENIZE.findall(text):
            ids.extend(self._vocab.encode_piece(piece.encode("utf-8")))
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for; special and timestamp tokens give their "<|...|>" spelling.

        Tokens are byte sequences, not characters: a CJK character or emoji may be spread over several
        tokens, so word splitting works on bytes.
        """
        token_id = int(token_id)
        if 0 <= token_id < self._vocab.eot:
            return self._vocab.token_bytes[token_id]
        return self._special_text(token_id).encode("utf-8")

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The raw bytes of the text tokens in ``ids``; special and timestamp tokens are dropped."""
        eot = self._vocab.eot
        table = self._vocab.token_bytes
        chunks = []
        for token_id in ids:
            token_id = int(token_id)
            if 0 <= token_id < eot:
                chunks.append(table[token_id])
            else:
                self._check_id(token_id)
        return b"".join(chunks)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids`` with special and timestamp tokens dropped.

        Bytes are joined before UTF-8 decoding, so characters split across tokens come out whole;
        an incomplete character (e.g. a truncated sequence) becomes U+FFFD instead of raising.
        """
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_with_timestamps(self, ids: Iterable[int]) -> str:
        """Like :meth:`decode`, but timestamps show as ``<|1.08|>`` and other specials by name.

        This is the readable form of a raw decoder output, e.g. ``<|0.00|> Hello.<|1.08|>``.
        """
        return b"".join(self.token_bytes(token_id) for token_id in ids).decode("utf-8", errors="replace")

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size})")

    def _special_text(self, token_id: int) -> str:
        self._check_id(token_id)
        if token_id >= self.timestamp_begin:
            return _format_timestamp(token_id - self.timestamp_begin)
        name = self._vocab.special_names.get(token_id)
        if name is None:
            raise ValueError(f"token id {token_id} is not defined in {self.path}")
        return name

    # ------------------------------------------------------------------ special tokens

    def _special(self, *names: str) -> int:
        for name in names:
            if name in self._vocab.specials:
                return self._vocab.specials[name]
        raise ModelLoadError(f"{self.path}: no {' / '.join(names)} token")

    @cached_property
    def eot(self) -> int:
        """<|endoftext|>: ends a transcript; every id from here upward is special."""
        return self._vocab.eot

    @cached_property
    def sot(self) -> int:
        """<|startoftranscript|>: first token of every decoder prompt."""
        return self._special("<|startoftranscript|>")

    @cached_property
    def sot_prev(self) -> int:
        """<|startofprev|>: introduces previous-window text given as context."""
        return self._special("<|startofprev|>")

    @cached_property
    def sot_lm(self) -> int:
        """<|startoflm|>: language-model-only prompt start (unused in transcription)."""
        return self._special("<|startoflm|>")

    @cached_property
    def no_speech(self) -> int:
        """<|nospeech|> (called <|nocaptions|> in older files): its probability after sot flags silence."""
        return self._special("<|nospeech|>", "<|nocaptions|>")

    @cached_property
    def no_timestamps(self) -> int:
        """<|notimestamps|>: asks for text without timestamp tokens."""
        return self._special("<|notimestamps|>")

    @cached_property
    def transcribe(self) -> int:
        """<|transcribe|>: task token for same-language output."""
        return self._special("<|transcribe|>")

    @cached_property
    def translate(self) -> int:
        """<|translate|>: task token for English output."""
        return self._special("<|translate|>")

    @cached_property
    def timestamp_begin(self) -> int:
        """<|0.00|>: timestamp tokens are not in tokenizer.json; they follow <|notimestamps|>."""
        return self.no_timestamps + 1

    @cached_property
    def vocab_size(self) -> int:
        """Number of logits the model produces (text, specials and timestamps)."""
        return self.timestamp_begin + NUM_TIMESTAMP_TOKENS

    def is_timestamp(self, token_id: int) -> bool:
        return self.timestamp_begin <= int(token_id) < self.vocab_size

    def timestamp_seconds(self, token_id: int) -> float:
        """Seconds from the window start that a timestamp token denotes (0.02 s per step)."""
        if not self.is_timestamp(token_id):
            raise ValueError(f"token id {token_id} is not a timestamp token")
        return round((int(token_id) - self.timestamp_begin) * SECONDS_PER_TIMESTAMP, 2)

    @cached_property
    def all_language_tokens(self) -> tuple[int, ...]:
        """Ids of the <|xx|> tokens this model knows, in id order (the order of its language logits)."""
        return tuple(self._vocab.languages.values())

    @cached_property
    def all_language_codes(self) -> tuple[str, ...]:
        """Codes of :attr:`all_language_tokens`, in the same order; "he" even where the file says <|iw|>."""
        return tuple(self._vocab.languages)

    def language_token(self, language: str | None = None) -> int:
        """Id of <|xx|> for a code or language name; defaults to this tokenizer's language."""
        if language is None:
            if self.language is None:
                raise TokenizerOptionError("no language given and none configured")
            language = self.language
        code = normalize_language(language)
        token_id = self._vocab.languages.get(code)
        if token_id is None:
            raise TokenizerOptionError(f"language {code!r} is not in this model's vocabulary")
        return token_id

    def to_language_token(self, language: str) -> int:
        """The reference's name for :meth:`language_token` with a language given."""
        return self.language_token(language)

    @cached_property
    def sot_sequence(self) -> tuple[int, ...]:
        """The decoder prompt before any text: sot [, language] [, task].

        English-only models take (sot,) alone. Multilingual models get the language token when a
        language is set (otherwise it is detected first) and always a task token.
        """
        if not self.multilingual:
            return (self.sot,)
        sequence = [self.sot]
        if self.language is not None:
            sequence.append(self.language_token(self.language))
        sequence.append(self.translate if self.task == "translate" else self.transcribe)
        return tuple(sequence)

    @cached_property
    def sot_sequence_including_notimestamps(self) -> tuple[int, ...]:
        return (*self.sot_sequence, self.no_timestamps)

    # ------------------------------------------------------------------ suppression

    @cached_property
    def non_speech_tokens(self) -> tuple[int, ...]:
        """Sorted ids that would start a speaker tag, sound annotation or music note (``non_speech.py``)."""
        return non_speech_token_ids(self.encode)

    def default_suppress_tokens(self) -> tuple[int, ...]:
        """Ids never sampled under the reference default ``suppress_tokens="-1"``.

        Non-speech symbols plus the prompt-only specials, which must not appear inside a transcript.
        """
        specials = {self.translate, self.transcribe, self.sot, self.sot_prev, self.sot_lm, self.no_speech}
        return tuple(sorted(set(self.non_speech_tokens) | specials))

    # ------------------------------------------------------------------ word splitting

    def split_to_word_tokens(
        self, ids: Sequence[int], language: str | None = None
    ) -> tuple[list[str], list[list[int]]]:
        """Group tokens into words for word-level timestamps; returns (words, token lists).

        Spaced languages split before tokens that start with a space, are punctuation, or are special;
        unspaced ones (zh, ja, th, lo, my, yue) split wherever a whole character has been completed.
        Every token lands in exactly one group, in order. The rules are the reference's, so word
        boundaries (and hence word timings) match it.
        """
        code = normalize_language(language) if language is not None else self.language
        if code in _UNSPACED_LANGUAGES:
            return split_on_characters(self, ids)
        return split_on_spaces(self, ids)

    def split_tokens_on_unicode(self, tokens: Sequence[int]) -> tuple[list[str], list[list[int]]]:
        """The reference's name: one group per completed UTF-8 character run (unspaced languages)."""
        return split_on_characters(self, tokens)

    def split_tokens_on_spaces(self, tokens: Sequence[int]) -> tuple[list[str], list[list[int]]]:
        """The reference's name: one group per space-led word or punctuation (spaced languages)."""
        return split_on_spaces(self, tokens)


def get_tokenizer(
    multilingual: bool | str | Path,
    *,
    num_languages: int | None = None,
    language: str | None = None,
    task: str | None = None,
) -> Tokenizer:
    """A tokenizer, openai-whisper's way or from a file.

    ``get_tokenizer(multilingual, num_languages=99, language=None, task=None)`` is the reference's call:
    the packaged vocabulary of an English-only or a multilingual model; a multilingual one defaults to
    English transcription, as the reference's does. ``get_tokenizer(path, language=..., task=...)`` reads
    a model directory (holding tokenizer.json) or a tokenizer.json; its language stays open until set.
    The parsed vocabulary is cached per file, so calling this per request is cheap.
    """
    if isinstance(multilingual, (str, PathLike)):
        return Tokenizer.from_file(multilingual, language=language, task=task, num_languages=num_languages)
    return _packaged_tokenizer(
        bool(multilingual), 99 if num_languages is None else num_languages, language, task
    )


def _packaged_tokenizer(
    multilingual: bool, num_languages: int, language: str | None, task: str | None
) -> Tokenizer:
    """The tokenizer.json installed with a model of that kind (tiny.en's, or base's for 99 languages)."""
    from whisperkv.model.dims import KNOWN_DIMS
    from whisperkv.weights.registry import default_tokenizer_path

    if multilingual:
        dims = KNOWN_DIMS["large-v3"] if num_languages == 100 else KNOWN_DIMS["base"]
        language = language or "en"
    else:
        dims = KNOWN_DIMS["tiny.en"]
    return Tokenizer.from_file(
        default_tokenizer_path(dims),
        multilingual=multilingual,
        language=language,
        task=task,
        num_languages=num_languages,
    )
