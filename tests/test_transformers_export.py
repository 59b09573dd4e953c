"""``whisperkv convert --format transformers``: a directory transformers uses as it is, offline.

Loaded by transformers' own classes with ``HF_HUB_OFFLINE=1`` (nothing may come from the Hub): the
tokenizer has every id of the vocabulary (the timestamps too), the ASR pipeline transcribes, and
``generate``'s greedy tokens are whisperkv's, with and without timestamps.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch

import whisperkv
from whisperkv.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
from whisperkv.cli import main
from whisperkv.decoding.decode import decode_window
from whisperkv.decoding.options import DecodingOptions
from whisperkv.errors import ModelLoadError
from whisperkv.weights.convert import convert

from .conftest import SPEECH_DIR, require_oracle, speech_manifest

pytestmark = pytest.mark.oracle
transformers = require_oracle("transformers")
JFK = SPEECH_DIR / "en" / "jfk.flac"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, speech_dir):
    os.environ["HF_HUB_OFFLINE"] = "1"
    out = tmp_path_factory.mktemp("hf") / "tiny.en"
    assert main(["convert", "tiny.en", str(out), "--format", "transformers"]) == 0
    return out


def first_window(model, path) -> torch.Tensor:
    mel = log_mel_spectrogram(whisperkv.load_audio(path), model.dims.n_mels, padding=N_SAMPLES)
    return pad_or_trim(mel[:, : mel.shape[-1] - N_FRAMES], N_FRAMES)[None].contiguous()


def test_every_file_transformers_reads(exported, tiny_model):
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert {"preprocessor_config.json", "generation_config.json"} <= names
    preprocessor = json.loads((exported / "preprocessor_config.json").read_text())
    assert (preprocessor["feature_size"], preprocessor["sampling_rate"], preprocessor["n_samples"]) == (
        80,
        16000,
        480000,
    )
    generation = json.loads((exported / "generation_config.json").read_text())
    tokenizer = tiny_model.tokenizer
    assert generation["no_timestamps_token_id"] == tokenizer.no_timestamps == 50362
    assert generation["decoder_start_token_id"] == tokenizer.sot == 50257
    assert generation["eos_token_id"] == tokenizer.eot and generation["is_multilingual"] is False
    assert generation["begin_suppress_tokens"] == [220, 50256]
    assert generation["suppress_tokens"] == list(tokenizer.default_suppress_tokens())
    assert [tuple(h) for h in generation["alignment_heads"]] == [tuple(h) for h in tiny_model.alignment_heads]
    assert generation["max_initial_timestamp_index"] == 50


def test_tokenizer_has_the_whole_vocabulary(exported):
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(exported / "tokenizer.json")).get_vocab_size() == 51864
    hf = transformers.AutoTokenizer.from_pretrained(str(exported))
    assert len(hf) == 51864
    assert hf.convert_ids_to_tokens([50363, 50364, 51863]) == ["<|0.00|>", "<|0.02|>", "<|30.00|>"]
    assert hf.convert_tokens_to_ids("<|1.00|>") == 50363 + 50
    text = hf.decode([50363, 843, 523, 50413], decode_with_timestamps=True)
    assert text == "<|0.00|> And so<|1.00|>"
    assert hf.all_special_ids[-1] + 1 == 50363  # how transformers finds the first timestamp


@pytest.mark.parametrize(
    "clip", ["jfk.flac", pytest.param("ls_1089-134686-0000.flac", marks=pytest.mark.slow)]
)
def test_generate_greedy_tokens_equal_ours(exported, tiny_model, clip):
    model = transformers.WhisperForConditionalGeneration.from_pretrained(str(exported)).eval()
    mel = first_window(tiny_model, SPEECH_DIR / "en" / clip)
    features = tiny_model.embed_audio(mel)
    for timestamps in (True, False):
        options = DecodingOptions(language="en", without_timestamps=not timestamps)
        ours = decode_window(tiny_model, tiny_model.tokenizer, features, options).tokens
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = model.generate(input_features=mel, return_timestamps=timestamps)[0].tolist()
        assert theirs == ours, (clip, timestamps)
        assert any(t >= 50363 for t in ours) == timestamps


@pytest.mark.slow  # the pipeline's own feature extractor and generate loop: ~80 s on two busy cores
def test_asr_pipeline_transcribes_offline(exported, tiny_model):
    audio = whisperkv.load_audio(JFK)
    asr = transformers.pipeline("automatic-speech-recognition", model=str(exported), device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = asr({"raw": audio, "sampling_rate": 16000}, return_timestamps=True)
    # its own log-Mel (numpy's STFT, not ours): the words are the same, a comma may not be
    normalise = require_oracle("whisper_normalizer.english").EnglishTextNormalizer()
    ours = tiny_model.transcribe(audio)
    said = {row["file"]: row["reference"] for row in speech_manifest()}["en/jfk.flac"]
    assert normalise(result["text"]) == normalise(ours["text"]) == normalise(said)
    stamps = [c["timestamp"] for c in result["chunks"]]
    assert len(stamps) == len(ours["segments"]) and stamps[0][0] == 0.0 and 10.0 <= stamps[-1][1] <= 11.0


def test_unknown_format_and_wrong_tokenizer_refused(tmp_path, tiny_model):
    from whisperkv.weights.transformers_files import complete_tokenizer_json

    with pytest.raises(ValueError, match="unknown format 'onnx'"):
        convert("tiny.en", tmp_path / "x", "onnx")
    source = json.loads(Path(tiny_model.tokenizer.path).read_text(encoding="utf-8"))
    source["added_tokens"] = source["added_tokens"][:-3]  # the last specials gone: ids no longer line up
    broken = tmp_path / "tokenizer.json"
    broken.write_text(json.dumps(source), encoding="utf-8")
    with pytest.raises((ValueError, ModelLoadError), match="tokenizer|vocabulary"):
        complete_tokenizer_json(broken, tmp_path / "out.json", tiny_model.dims)
    assert not (tmp_path / "out.json").exists()


@pytest.mark.slow
def test_base_export_language_ids_and_tokens(tmp_path, base_model):
    out = convert("base", tmp_path / "base", "transformers")
    generation = json.loads((out / "generation_config.json").read_text())
    tokenizer = base_model.tokenizer
    assert generation["is_multilingual"] is True and len(generation["lang_to_id"]) == 99
    assert generation["lang_to_id"]["<|fr|>"] == tokenizer.to_language_token("fr")
    assert generation["task_to_id"] == {"transcribe": tokenizer.transcribe, "translate": tokenizer.translate}
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    assert len(hf) == 51865 and hf.convert_ids_to_tokens(51864) == "<|30.00|>"
    model = transformers.WhisperForConditionalGeneration.from_pretrained(str(out)).eval()
    mel = first_window(base_model, SPEECH_DIR / "xx" / "pv_test_fr.wav")
    options = DecodingOptions(language="fr")
    ours = decode_window(
        base_model, tokenizer.with_options(language="fr"), base_model.embed_audio(mel), options
    )
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = model.generate(input_features=mel, language="fr", task="transcribe", return_timestamps=True)
    assert theirs[0].tolist() == ours.tokens
