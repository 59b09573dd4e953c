"""Our weights read by engines we did not write: CTranslate2 itself and transformers.

Every parity test feeds openai-whisper a ``.pt`` that our own CTranslate2 parser produced, so a parsing
bug shared by both sides would be invisible there. Here:
* the very ``model.bin`` our parser reads is run by CTranslate2's own runtime (faster-whisper's engine):
  its encoder output must be close to ours and its greedy tokens identical, on a few real clips;
* our transformers export (``whisperkv convert ... --format safetensors``) is loaded by transformers'
  ``WhisperForConditionalGeneration``: every tensor found, and the same encoder output and logits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import whisperkv
from whisperkv.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim
from whisperkv.decoding.decode import decode_window
from whisperkv.decoding.options import DecodingOptions
from whisperkv.weights.convert import convert

from .conftest import require_oracle

pytestmark = pytest.mark.oracle
ctranslate2 = require_oracle("ctranslate2")
transformers = require_oracle("transformers")

CLIPS = ["jfk.flac", "ls_1089-134686-0000.flac", "lj_LJ001-0001.flac"]
#: CTranslate2 runs its own kernels (oneDNN / its GEMM, its layer norm and softmax), in float32 from the
#: same float16-stored weights: encoder outputs (magnitudes up to ~12) agree to a few 1e-3.
#: Measured max |Δ| per clip: 3.3e-05, 2.0e-03, 3.1e-05.
CT2_ENCODER_ATOL = 5e-3
#: transformers runs the same PyTorch operations on the same float32 tensors. Measured: 0.0.
HF_ATOL = 1e-4


@pytest.fixture(scope="module")
def windows(speech_dir) -> dict[str, torch.Tensor]:
    """Each clip's first 30 s log-Mel window [1, 80, 3000], computed once by us and fed to every engine."""
    out = {}
    for name in CLIPS:
        mel = log_mel_spectrogram(whisperkv.load_audio(speech_dir / "en" / name), 80, padding=N_SAMPLES)
        out[name] = pad_or_trim(mel[:, : mel.shape[-1] - N_FRAMES], N_FRAMES)[None].contiguous()
    return out


@pytest.fixture(scope="module")
def ct2_whisper(tiny_model):
    model_dir = Path(tiny_model.source)
    assert (model_dir / "model.bin").is_file(), "tiny.en must be the CTranslate2 directory our parser read"
    return ctranslate2.models.Whisper(
        str(model_dir), device="cpu", compute_type="float32", intra_threads=torch.get_num_threads()
    )


def test_ctranslate2_encoder_output_close_to_ours(tiny_model, ct2_whisper, windows):
    diffs = {}
    for name, mel in windows.items():
        ours = tiny_model.embed_audio(mel)
        encoded = ct2_whisper.encode(ctranslate2.StorageView.from_array(mel.numpy()))
        theirs = torch.from_numpy(np.array(encoded))
        assert theirs.shape == ours.shape == (1, 1500, 384)
        diffs[name] = float((ours - theirs).abs().max())
    print("CTranslate2 vs whisperkv encoder max |Δ|:", {k: f"{v:.2g}" for k, v in diffs.items()})
    assert max(diffs.values()) <= CT2_ENCODER_ATOL, diffs


@pytest.mark.parametrize(
    "without_timestamps",
    # without timestamps in -m slow only: the default run checks that decode against openai-whisper
    # (test_parity's without_timestamps), and this one's 4-5 s buy no other path
    [pytest.param(True, marks=pytest.mark.slow, id="no_timestamps"), pytest.param(False, id="timestamps")],
)
def test_ctranslate2_greedy_tokens_identical(tiny_model, ct2_whisper, windows, without_timestamps):
    """CTranslate2 decodes from its own encoding of the window; ours from ours."""
    tokenizer = tiny_model.tokenizer
    options = DecodingOptions(language="en", without_timestamps=without_timestamps)
    prompt = list(
        tokenizer.sot_sequence_including_notimestamps if without_timestamps else tokenizer.sot_sequence
    )
    for name, mel in windows.items():
        ours = decode_window(tiny_model, tokenizer, tiny_model.embed_audio(mel), options).tokens
        (theirs,) = ct2_whisper.generate(
            ctranslate2.StorageView.from_array(mel.numpy()), [prompt], beam_size=1, max_length=224
        )
        assert len(ours) > 10, name
        assert theirs.sequences_ids[0] == ours, f"{name}:\n ours {ours}\n ct2  {theirs.sequences_ids[0]}"
        if not without_timestamps:
            assert any(t >= tokenizer.timestamp_begin for t in ours), name


@pytest.fixture(scope="module")
def hf_whisper(tmp_path_factory):
    exported = convert("tiny.en", tmp_path_factory.mktemp("hf") / "tiny.en", "safetensors")
    model, info = transformers.WhisperForConditionalGeneration.from_pretrained(
        str(exported), output_loading_info=True
    )
    return model.eval(), info


def test_transformers_loads_our_export_with_every_tensor(hf_whisper):
    model, info = hf_whisper
    problems = {k: v for k, v in info.items() if v and k != "mismatched_keys"} | {
        "mismatched_keys": info.get("mismatched_keys", [])
    }
    assert not any(problems.values()), problems
    assert model.config.d_model == 384 and model.config.vocab_size == 51864
    # the output projection is the token embedding (tied), as in Whisper
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()


def test_transformers_first_step_logits_equal_ours(tiny_model, hf_whisper, windows):
    model, _ = hf_whisper
    tokenizer = tiny_model.tokenizer
    prompt = torch.tensor([list(tokenizer.sot_sequence_including_notimestamps)])
    for name, mel in windows.items():
        with torch.no_grad():
            features = tiny_model.embed_audio(mel)
            cross = tiny_model.decoder.project_cross_kv(features, tiny_model.encoder_provenance(mel))
            ours = tiny_model.decoder(prompt, tiny_model.decoder.new_cache(cross))
            theirs = model(input_features=mel, decoder_input_ids=prompt)
        encoder_diff = float((theirs.encoder_last_hidden_state - features).abs().max())
        logit_diff = float((theirs.logits - ours).abs().max())
        print(f"{name}: transformers vs ours, max |Δ| encoder {encoder_diff:.2g}, logits {logit_diff:.2g}")
        assert encoder_diff <= HF_ATOL and logit_diff <= HF_ATOL, name
        assert int(theirs.logits[0, -1].argmax()) == int(ours[0, -1].argmax())
