"""What a transformers Whisper directory holds beside its weights, so that transformers' ASR pipeline and
``optimum-cli export openvino --model DIR`` load it offline, with nothing written by hand:

* ``tokenizer.json`` with every id of the model's vocabulary: the BPE vocabulary and special tokens of the
  source's tokenizer plus the 1,501 timestamp tokens ``<|0.00|>`` … ``<|30.00|>`` (CTranslate2's
  tokenizer.json stops at ``<|notimestamps|>``), added as plain tokens, since transformers finds the
  first timestamp as the id after the last special one; then ``tokenizer_config.json`` and
  ``special_tokens_map.json`` through transformers' own ``WhisperTokenizer.save_pretrained``;
* ``preprocessor_config.json``: ``WhisperFeatureExtractor(feature_size=n_mels)``, 16 kHz, 30 s windows;
* ``generation_config.json``: a ``GenerationConfig`` with what Whisper's ``generate`` reads — the
  alignment heads, suppressed tokens (openai-whisper's ``"-1"`` set, and blank / end of text at the
  start), the language and task ids, the special tokens, the longest first timestamp (1 s).
transformers is imported only here and only when a directory is written (it is the test extra's); without
it the complete tokenizer.json is still written, and a warning names the three files left out.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from whisperkv.model.dims import ModelDims
from whisperkv.tokenizer import Tokenizer

N_TIMESTAMPS = 1501  # <|0.00|> to <|30.00|>, every 0.02 s
TIME_PRECISION = 0.02
MAX_INITIAL_TIMESTAMP_S = 1.0  # openai-whisper's default


def timestamp_token(index: int) -> str:
    return f"<|{index * TIME_PRECISION:.2f}|>"


def complete_tokenizer_json(source: Path, destination: Path, dims: ModelDims) -> Tokenizer:
    """``destination``: the tokenizer.json at ``source`` with every one of ``dims.n_vocab`` ids (the
    timestamps appended when missing); the whisperkv tokenizer read back from it."""
    data = json.loads(Path(source).read_text(encoding="utf-8"))
    ours = Tokenizer.from_file(source, multilingual=dims.is_multilingual)
    first = ours.no_timestamps + 1
    added = data.setdefault("added_tokens", [])
    ids = set(data["model"]["vocab"].values()) | {t["id"] for t in added}
    if len(ids) == first and max(ids) == first - 1:  # CTranslate2's files: the timestamps are missing
        added.extend(
            {
                "id": first + i,
                "content": timestamp_token(i),
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": False,  # transformers: the first timestamp is the id after the last special
            }
            for i in range(N_TIMESTAMPS)
        )
        ids |= set(range(first, first + N_TIMESTAMPS))
    if ids != set(range(dims.n_vocab)):
        raise ValueError(
            f"{source}: its {len(ids)} token ids are not the model's {dims.n_vocab} "
            f"(0 to {dims.n_vocab - 1}, <|0.00|> at {first}): not this model's tokenizer"
        )
    destination.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    written = Tokenizer.from_file(destination, multilingual=dims.is_multilingual)
    assert written.no_timestamps == ours.no_timestamps and written.sot == ours.sot
    return written


def write_tokenizer_config(destination: Path, dims: ModelDims) -> None:
    """tokenizer_config.json and special_tokens_map.json, by transformers' ``WhisperTokenizer``."""
    from transformers import WhisperTokenizer

    added = json.loads((destination / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    hf = WhisperTokenizer(
        tokenizer_file=str(destination / "tokenizer.json"),
        # every special token by name: transformers takes the id after the last one as <|0.00|>
        additional_special_tokens=[t["content"] for t in added if t["special"]],
        unk_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        model_max_length=dims.n_text_ctx,
    )
    hf.save_pretrained(str(destination))


def write_preprocessor(destination: Path, dims: ModelDims) -> None:
    from transformers import WhisperFeatureExtractor

    WhisperFeatureExtractor(feature_size=dims.n_mels).save_pretrained(str(destination))


def generation_config(tokenizer: Tokenizer, dims: ModelDims, alignment_heads: list | None) -> dict:
    """The fields of Whisper's generation config for this vocabulary (ids from the tokenizer itself)."""
    config = {
        "alignment_heads": [list(h) for h in alignment_heads] if alignment_heads else None,
        "begin_suppress_tokens": [tokenizer.encode(" ")[0], tokenizer.eot],
        "suppress_tokens": list(tokenizer.default_suppress_tokens()),
        "bos_token_id": tokenizer.eot,
        "eos_token_id": tokenizer.eot,
        "pad_token_id": tokenizer.eot,
        "decoder_start_token_id": tokenizer.sot,
        "no_timestamps_token_id": tokenizer.no_timestamps,
        "prev_sot_token_id": tokenizer.sot_prev,
        "max_initial_timestamp_index": round(MAX_INITIAL_TIMESTAMP_S / TIME_PRECISION),
        "max_length": dims.n_text_ctx,
        "is_multilingual": dims.is_multilingual,
        "return_timestamps": False,
    }
    if dims.is_multilingual:
        config["lang_to_id"] = {
            f"<|{code}|>": token
            for code, token in zip(tokenizer.all_language_codes, tokenizer.all_language_tokens)
        }
        config["task_to_id"] = {"transcribe": tokenizer.transcribe, "translate": tokenizer.translate}
        config["forced_decoder_ids"] = [[1, None], [2, tokenizer.transcribe]]
    else:
        config["forced_decoder_ids"] = [[1, tokenizer.no_timestamps]]
    return config


def write_generation_config(destination: Path, config: dict) -> None:
    """Through transformers' ``GenerationConfig`` (it checks the fields and writes its own keys)."""
    from transformers import GenerationConfig

    GenerationConfig(**config).save_pretrained(str(destination))


def write_transformers_files(
    tokenizer_source: Path, destination: Path, dims: ModelDims, alignment_heads: list | None
) -> None:
    """Every file above into ``destination`` (which holds config.json and model.safetensors)."""
    tokenizer = complete_tokenizer_json(Path(tokenizer_source), destination / "tokenizer.json", dims)
    try:
        import transformers  # noqa: F401 - its classes write the three configs
    except ImportError:
        warnings.warn(
            "transformers is not installed: tokenizer_config.json, preprocessor_config.json and "
            "generation_config.json not written (pip install transformers, then convert again)",
            stacklevel=3,
        )
        return
    write_tokenizer_config(destination, dims)
    write_preprocessor(destination, dims)
    write_generation_config(destination, generation_config(tokenizer, dims, alignment_heads))
