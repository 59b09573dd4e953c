"""openai-whisper's names in whisperkv beyond what its own suite checks: signatures and results.

``tests/test_openai_whisper_suite.py`` runs the reference's tests; these pin the rest of the drop-in
surface (``get_tokenizer(multilingual, ...)``, ``detect_language(model, mel)``, ``model.logits``,
``timing.dtw_cuda`` / ``add_word_timestamps``, ``utils.get_writer``) against the reference or by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import whisperkv
from tests.conftest import SPEECH_DIR, require_oracle
from whisperkv.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim
from whisperkv.errors import ModelLoadError
from whisperkv.tokenizer import get_tokenizer

JFK = SPEECH_DIR / "en" / "jfk.flac"
TEXTS = ["And so my fellow Americans, ask not", " Grüße aus Köln! 東京タワー", "'tis 3.14 — ok?"]


@pytest.fixture(scope="module")
def jfk_mel() -> torch.Tensor:
    if not JFK.is_file():
        pytest.skip(f"{JFK} not found")
    return pad_or_trim(log_mel_spectrogram(str(JFK)), N_FRAMES)


@pytest.mark.oracle
@pytest.mark.parametrize("multilingual", [False, True])
def test_get_tokenizer_with_the_references_signature(multilingual):
    reference = require_oracle("whisper.tokenizer").get_tokenizer(multilingual, num_languages=99)
    ours = get_tokenizer(multilingual, num_languages=99)
    assert ours.sot_sequence == tuple(reference.sot_sequence)  # a multilingual one defaults to English
    # the same token for each code (the reference lists them in its dict's order, ours in id order)
    theirs = dict(zip(reference.all_language_codes, reference.all_language_tokens))
    assert dict(zip(ours.all_language_codes, ours.all_language_tokens)) == theirs
    assert ours.timestamp_begin == reference.timestamp_begin and ours.eot == reference.eot
    for text in TEXTS:
        assert ours.encode(text) == reference.encode(text)
    german = get_tokenizer(multilingual=True, language="German", task="translate")
    assert german.sot_sequence == (german.sot, german.to_language_token("de"), german.translate)


@pytest.mark.oracle
def test_split_tokens_matches_the_reference():
    reference = require_oracle("whisper.tokenizer").get_tokenizer(True, language="ja")
    ours = get_tokenizer(True, language="ja")
    tokens = ours.encode(" 東京タワー is tall, isn't it?")
    assert ours.split_tokens_on_unicode(tokens) == reference.split_tokens_on_unicode(tokens)
    assert ours.split_tokens_on_spaces(tokens) == reference.split_tokens_on_spaces(tokens)


def test_get_tokenizer_refusals_name_the_problem(tmp_path):
    # large-v3's 100 languages: derived from base's vocabulary (tests/test_model_sizes.py checks it)
    assert len(get_tokenizer(True, num_languages=100).all_language_codes) == 100
    with pytest.raises(ModelLoadError, match="100"):
        get_tokenizer(False, num_languages=100)
    with pytest.raises(ValueError, match="klingon"):
        get_tokenizer(True, language="klingon")
    with pytest.raises(ModelLoadError, match="not found"):
        get_tokenizer(tmp_path / "missing.json")  # a path is still read as a file


@pytest.mark.oracle
def test_model_logits_equal_the_references(tiny_model, reference_model, jfk_mel):
    tokens = torch.tensor([[50257, 50362, 400, 370, 452]])
    features = tiny_model.embed_audio(jfk_mel[None])
    ours = tiny_model.logits(tokens, features)
    theirs = reference_model.logits(tokens, reference_model.embed_audio(jfk_mel[None]))
    assert ours.shape == (1, 5, tiny_model.dims.n_vocab)
    assert torch.allclose(ours, theirs, atol=1e-3), (ours - theirs).abs().max()
    assert torch.equal(tiny_model(jfk_mel[None], tokens), ours)


def test_detect_language_has_the_references_shape(base_model, jfk_mel):
    tokenizer = base_model.tokenizer
    token, probs = whisperkv.detect_language(base_model, jfk_mel)
    assert token.ndim == 0 and int(token) == tokenizer.language_token("en")
    assert set(probs) == set(tokenizer.all_language_codes) and sum(probs.values()) == pytest.approx(1.0)
    code, own_probs = base_model.detect_language(jfk_mel)  # whisperkv's own shape stays
    assert code == "en" and max(abs(probs[k] - own_probs[k]) for k in probs) < 1e-5
    tokens, batch = whisperkv.detect_language(base_model, torch.stack([jfk_mel, jfk_mel]))
    assert tokens.tolist() == [int(token)] * 2 and batch[1]["en"] == pytest.approx(probs["en"], abs=1e-5)


def test_detect_language_refuses_an_english_only_model(tiny_model, jfk_mel):
    with pytest.raises(ValueError, match="language tokens"):
        whisperkv.detect_language(tiny_model, jfk_mel)


def test_dtw_cuda_name_gives_dtw_cpus_path():
    x = np.random.default_rng(0).random((12, 30))
    path = whisperkv.timing.dtw_cpu(x)
    assert path.shape[0] == 2 and path[:, 0].tolist() == [0, 0] and path[:, -1].tolist() == [11, 29]
    assert np.array_equal(whisperkv.timing.dtw_cuda(torch.from_numpy(x)), path)


def test_add_word_timestamps_called_as_the_reference_calls_it(tiny_model, jfk_mel):
    """Keyword arguments only, a bare Mel window, no cached window: as whisper/transcribe.py does."""
    tokenizer = tiny_model.tokenizer
    text = tokenizer.encode(" And so my fellow Americans, ask not what your country can do for you")
    segments = [{"seek": 0, "start": 0.0, "end": 10.0, "tokens": text}]
    whisperkv.timing.add_word_timestamps(
        segments=segments,
        model=tiny_model,
        tokenizer=tokenizer,
        mel=jfk_mel,
        num_frames=N_FRAMES,
        prepend_punctuations="\"'“¿([{-",
        append_punctuations="\"'.。,，!！?？:：”)]}、",
        last_speech_timestamp=0.0,
    )
    words = segments[0]["words"]
    assert [w["word"] for w in words][:5] == [" And", " so", " my", " fellow", " Americans,"]
    americans = words[4]
    assert americans["start"] <= 1.8 <= americans["end"]  # the reference suite's own bound
    assert all(a["end"] <= b["start"] + 1e-9 for a, b in zip(words, words[1:]))


def test_get_writer_takes_options_as_a_dict_or_as_keywords(tmp_path):
    result = {
        "text": " ask not what your country can do for you",
        "language": "en",
        "segments": [
            {
                "start": 0.0,
                "end": 2.0,
                "text": " ask not what your country can do for you",
                "words": [
                    {"word": " " + w, "start": i * 0.2, "end": i * 0.2 + 0.2}
                    for i, w in enumerate("ask not what your country can do for you".split())
                ],
            }
        ],
    }
    writer = whisperkv.utils.get_writer("srt", str(tmp_path))
    writer(result, "/audio/clip.flac", max_words_per_line=3)
    keywords = (tmp_path / "clip.srt").read_text()
    writer(result, "/audio/clip.flac", {"max_words_per_line": 3})
    assert (tmp_path / "clip.srt").read_text() == keywords
    assert keywords.count("-->") == 3 and "00:00:00,000 --> 00:00:00,600\nask not what\n" in keywords
    with pytest.raises(ValueError):
        whisperkv.utils.get_writer("docx", str(tmp_path))


@pytest.mark.oracle
def test_decode_of_a_batch_gives_one_result_per_window_as_the_reference(tiny_model, reference_model, jfk_mel):
    whisper = require_oracle("whisper")
    clip = SPEECH_DIR / "en" / "lj_LJ001-0007.flac"
    mels = torch.stack([jfk_mel, pad_or_trim(log_mel_spectrogram(str(clip)), N_FRAMES)])
    ours = whisperkv.decode(tiny_model, mels, whisperkv.DecodingOptions(language="en", fp16=False))
    theirs = whisper.decode(reference_model, mels, whisper.DecodingOptions(language="en", fp16=False))
    assert [r.text for r in ours] == [r.text for r in theirs] and len(ours) == 2
    assert ours[0].tokens == tiny_model.decode(jfk_mel, language="en", fp16=False).tokens


def test_load_model_takes_the_references_keywords(tmp_path):
    """``load_model(name, device=None, download_root=..., in_memory=True)`` as code for openai-whisper
    calls it: on a machine without CUDA that is the CPU, and nothing is written to the download root."""
    model = whisperkv.load_model("tiny.en", device=None, download_root=str(tmp_path), in_memory=True)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert model.device.type == expected and list(tmp_path.iterdir()) == []
    assert model.dims.n_vocab == 51864 and not model.is_multilingual and model.num_languages == 99
