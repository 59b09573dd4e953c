"""A byte-level BPE vocabulary read from a Hugging Face ``tokenizer.json``, encoded as tiktoken does.

Token ids are BPE merge ranks: the reference (tiktoken) merges, at each step, the adjacent pair whose
concatenation has the lowest id. We do the same rather than replaying ``model.merges``: the multilingual
file's merge list lacks the very first merge (``"Ġ t"``, id 256), so a merge-list replay would encode
every word starting with " t" differently from the reference, while ids are complete.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import regex

from whisperkv.errors import ModelLoadError
from whisperkv.languages import LANGUAGES, LEGACY_LANGUAGE_CODES

# GPT-2's pre-tokenizer: BPE never merges across these pieces.
PRETOKENIZE = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def _byte_alphabet() -> list[str]:
    """Map each byte to the printable character that stands for it in byte-level BPE files.

    Vocab files must be plain text, so bytes that print as themselves in Latin-1 keep their own code
    point and the remaining 68 (controls, space, soft hyphen, ...) are moved to 256, 257, ... in order.
    """
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 0x100)}
    alphabet: list[str] = []
    next_free = 256
    for byte in range(256):
        if byte in printable:
            alphabet.append(chr(byte))
        else:
            alphabet.append(chr(next_free))
            next_free += 1
    return alphabet


_CHAR_TO_BYTE: dict[str, int] = {char: byte for byte, char in enumerate(_byte_alphabet())}


def _vocab_key_to_bytes(key: str) -> bytes:
    try:
        return bytes(_CHAR_TO_BYTE[char] for char in key)
    except KeyError as exc:
        raise ValueError(f"vocabulary entry {key!r} is not byte-level text") from exc


class Vocabulary:
    """The immutable part of a tokenizer.json: byte strings, ids and special tokens.

    Shared by all Tokenizer objects made from the same file, so switching language or task is free.
    """

    def __init__(self, path: Path) -> None:
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
            vocab: dict[str, int] = data["model"]["vocab"]
            added: list[dict] = data.get("added_tokens", [])
        except FileNotFoundError as exc:
            raise ModelLoadError(f"{path}: tokenizer file not found") from exc
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{path}: not a Hugging Face tokenizer.json ({exc})") from exc

        self.path = path
        self.specials: dict[str, int] = {entry["content"]: int(entry["id"]) for entry in added}
        if "<|endoftext|>" not in self.specials:
            raise ModelLoadError(f"{path}: no <|endoftext|> among added_tokens")
        self.eot = self.specials["<|endoftext|>"]

        # Every id below <|endoftext|> is a plain BPE token; everything from eot upward is special.
        token_bytes: list[bytes | None] = [None] * self.eot
        for key, token_id in vocab.items():
            if 0 <= token_id < self.eot:
                try:
                    token_bytes[token_id] = _vocab_key_to_bytes(key)
                except ValueError as exc:
                    raise ModelLoadError(f"{path}: {exc}") from exc
        missing = [i for i, value in enumerate(token_bytes) if value is None]
        if missing:
            raise ModelLoadError(f"{path}: vocabulary has no entry for ids {missing[:5]}...")
        self.token_bytes: tuple[bytes, ...] = tuple(b for b in token_bytes if b is not None)

        # id doubles as merge rank. The multilingual file holds one empty entry; it can never match.
        self.ranks: dict[bytes, int] = {b: i for i, b in enumerate(self.token_bytes) if b}
        self.special_names: dict[int, str] = {token_id: name for name, token_id in self.specials.items()}

        # Language code -> <|xx|> id, in id order (the order of the model's language logits).
        self.languages: dict[str, int] = {}
        for token_id, name in sorted(self.special_names.items()):
            if name.startswith("<|") and name.endswith("|>"):
                code = LEGACY_LANGUAGE_CODES.get(name[2:-2], name[2:-2])
                if code in LANGUAGES:
                    self.languages[code] = token_id
        self.encode_piece = lru_cache(maxsize=1 << 16)(self._encode_piece)

    def _encode_piece(self, piece: bytes) -> tuple[int, ...]:
        """BPE-encode one pre-tokenized piece, exactly as tiktoken does.

        A piece that is itself a token is returned whole; otherwise start from single bytes and keep
        merging the leftmost adjacent pair whose concatenation has the lowest id.
        """
        whole = self.ranks.get(piece)
        if whole is not None:
            return (whole,)
        parts = [piece[i : i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            best_rank = -1
            best_index = -1
            for index in range(len(parts) - 1):
                rank = self.ranks.get(parts[index] + parts[index + 1])
                if rank is not None and (best_index < 0 or rank < best_rank):
                    best_rank, best_index = rank, index
            if best_index < 0:
                break
            parts[best_index : best_index + 2] = [parts[best_index] + parts[best_index + 1]]
        return tuple(self.ranks[part] for part in parts)


@lru_cache(maxsize=8)
def _load_vocabulary(path: str, mtime_ns: int) -> Vocabulary:
    # mtime is part of the cache key so an edited file is read again.
    return Vocabulary(Path(path))


def _resolve_tokenizer_json(path: str | Path) -> Path:
    path = Path(path)
    return path / "tokenizer.json" if path.is_dir() else path


def open_vocabulary(path: str | Path) -> Vocabulary:
    path = _resolve_tokenizer_json(path).resolve()
    try:
        mtime_ns = path.stat().st_mtime_ns
    except OSError as exc:
        raise ModelLoadError(f"{path}: tokenizer file not found") from exc
    return _load_vocabulary(str(path), mtime_ns)
