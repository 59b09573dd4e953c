"""The model sizes people run, with random weights of their real dimensions, against the reference.

Nothing larger than base ships with the project, and speed and correctness at a size are decided by its
shapes, so each size is drawn from a seed (``whisperkv/model/random_weights.py``), written once as an
OpenAI ``.pt`` and loaded by whisperkv and by openai-whisper: the same tensors in both. The work is made
equal by suppressing end-of-text and fixing the number of steps (``sample_len``).

The default run checks the shapes of every size against the reference's model, the 100-language
tokenizer, the 128-band log-Mel, and the C kernels at large-v3's width (1280, 20 heads, 51,866 tokens)
in a two-layer model; ``-m slow`` decodes small, large-v3-turbo, medium and large-v3 at full size.
"""

from __future__ import annotations

import pytest
import torch

import whisperkv
from whisperkv.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.decoding.options import DecodingOptions
from whisperkv.model.dims import KNOWN_DIMS, ModelDims
from whisperkv.model.random_weights import random_checkpoint, write_random_model

from .block_step_twins import cross_kv_of, decode_steps
from .conftest import SPEECH_DIR, require_oracle

pytestmark = pytest.mark.oracle
whisper = require_oracle("whisper")

#: large-v3's width, heads, Mel bands and vocabulary in two layers a side: the kernels at width 1280
WIDE_DIMS = ModelDims(128, 1500, 1280, 20, 2, 51866, 448, 1280, 20, 2)
CLIPS = ("en/jfk.flac", "long/lj001_0001-0032_concat.flac")
STEPS = 10


def _reference_dims(dims: ModelDims):
    return whisper.model.ModelDimensions(**dims.to_dict())


@pytest.mark.parametrize("size", ["tiny", "base", "small", "medium", "large-v3", "large-v3-turbo"])
def test_every_size_has_the_reference_models_tensors(size, monkeypatch):
    dims = KNOWN_DIMS[size]
    # the reference keeps its alignment heads as a sparse buffer (not in the state dict), which the meta
    # device cannot make: a dense one stands in, so no tensor of any size is allocated
    monkeypatch.setattr(torch.Tensor, "to_sparse", lambda self, *args, **kwargs: self)
    with torch.device("meta"):
        ours = whisperkv.model.Whisper(dims).state_dict()
        theirs = whisper.model.Whisper(_reference_dims(dims)).state_dict()
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}


def test_random_weights_come_from_the_seed_and_are_float16_values():
    small = ModelDims(80, 1500, 64, 2, 1, 51864, 448, 64, 2, 1)
    a, b, c = random_checkpoint(small, 0), random_checkpoint(small, 0), random_checkpoint(small, 1)
    for name, tensor in a.state_dict.items():
        assert torch.equal(tensor, b.state_dict[name]), name
        assert torch.equal(tensor.half().float(), tensor), f"{name} holds a value float16 cannot"
    weight = "decoder.blocks.0.mlp.0.weight"
    assert not torch.equal(a.state_dict[weight], c.state_dict[weight])
    assert torch.equal(a.state_dict["decoder.ln.weight"], torch.ones(64))
    assert torch.equal(a.state_dict["encoder.blocks.0.attn_ln.bias"], torch.zeros(64))
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        random_checkpoint("huge")


@pytest.fixture(scope="module")
def wide_pt(tmp_path_factory):
    return write_random_model(WIDE_DIMS, tmp_path_factory.mktemp("wide"), seed=0)


def test_the_hundred_language_tokenizer_is_the_references(wide_pt, tmp_path, monkeypatch):
    monkeypatch.setenv("WHISPERKV_CACHE", str(tmp_path))
    ours = whisperkv.tokenizer.get_tokenizer(True, num_languages=100)
    cached = tmp_path / "tokenizer-100-languages.json"
    assert ours.path == cached and cached.read_bytes() == (wide_pt.parent / "tokenizer.json").read_bytes()
    cached.write_text("{}")  # an altered copy is rewritten, not trusted
    assert whisperkv.tokenizer.get_tokenizer(True, num_languages=100).path.read_bytes() != b"{}"
    theirs = whisper.tokenizer.get_tokenizer(True, num_languages=100)
    assert len(ours.all_language_codes) == 100 and ours.all_language_codes[-1] == "yue"
    assert {code: ours.language_token(code) for code in ours.all_language_codes} == {
        code: theirs.to_language_token(code) for code in theirs.all_language_codes
    }
    for name in ("eot", "sot", "sot_prev", "sot_lm", "no_speech", "no_timestamps", "transcribe", "translate"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.timestamp_begin == theirs.timestamp_begin == 50365
    assert ours.with_options(language="yue", task="translate").sot_sequence == (
        whisper.tokenizer.get_tokenizer(
            True, num_languages=100, language="yue", task="translate"
        ).sot_sequence
    )
    text = " And so, my fellow Americans: 你好, ¿qué tal? Привет!"
    assert ours.encode(text) == theirs.encode(text)


def test_the_128_band_log_mel_is_the_references():
    audio = whisperkv.load_audio(SPEECH_DIR / "en" / "jfk.flac")
    ours = log_mel_spectrogram(audio, 128)
    theirs = whisper.log_mel_spectrogram(torch.from_numpy(audio), 128)
    assert ours.shape == theirs.shape and ours.shape[0] == 128
    assert float((ours - theirs).abs().max()) <= 1e-5


def _windows(n_mels: int, clips: tuple[str, ...] = CLIPS):
    for clip in clips:
        audio = whisperkv.load_audio(SPEECH_DIR / clip)
        yield clip, pad_or_trim(log_mel_spectrogram(audio, n_mels)[:, :N_FRAMES], N_FRAMES)


def _fixed_work_parity(ours, reference, clips: tuple[str, ...] = CLIPS) -> list[str]:
    """Tokens of ``STEPS`` steps with end-of-text suppressed, greedy and beam 5, on each clip's window
    (each engine decodes from its own encoder output, computed once per window)."""
    eot = ours.tokenizer.eot
    differences = []
    for clip, mel in _windows(ours.dims.n_mels, clips):
        with torch.no_grad():
            our_features, their_features = ours.embed_audio(mel[None]), reference.encoder(mel[None])
        gap = float((our_features - their_features).abs().max())
        assert gap <= 1e-3, f"{clip}: encoder outputs {gap} apart"
        for beam in (None, 5):
            options = dict(suppress_tokens=[-1, eot], sample_len=STEPS, beam_size=beam)
            if ours.is_multilingual:
                options["language"] = "en"
            a = whisperkv.decode(ours, our_features[0], DecodingOptions(**options))
            b = whisper.decode(reference, their_features[0], whisper.DecodingOptions(fp16=False, **options))
            assert len(b.tokens) == STEPS, "the reference did not take the fixed number of steps"
            if a.tokens != b.tokens:
                differences.append(f"{clip} beam {beam}: ours {a.tokens}, reference {b.tokens}")
    return differences


@pytest.fixture(scope="module")
def wide_models(wide_pt):
    """The width-1280 model as each CPU type loads it (one load each for the module), the float32 one
    with its step kernels on whatever the CPU (the default takes them with AVX-512 only, ``cpu/plan.py``;
    these tests prove them wherever they build)."""
    models = {kind: whisperkv.load_model(str(wide_pt), compute_type=kind) for kind in ("float32", "int8")}
    use_attention_kernels(models["float32"], rows=True)
    return models


def test_width_1280_through_the_kernels_gives_the_references_tokens(wide_pt, wide_models):
    ours = wide_models["float32"]
    assert "linears kernel" in ours.weights_digest, "the C kernels did not take width 1280"
    reference = whisper.load_model(str(wide_pt), device="cpu").float().eval()
    assert not _fixed_work_parity(ours, reference, CLIPS[:1])


@pytest.mark.slow
@pytest.mark.parametrize("size", ["small", "large-v3-turbo", "medium", "large-v3"])
def test_full_size_random_models_give_the_references_tokens(size, tmp_path):
    path = write_random_model(size, tmp_path, seed=0)
    ours = whisperkv.load_model(str(path))
    reference = whisper.load_model(str(path), device="cpu").float().eval()
    assert not _fixed_work_parity(ours, reference)


@pytest.mark.parametrize("compute_type", ["float32", "int8"])
def test_width_1280_whole_step_in_one_call_gives_its_twins_bits(wide_models, compute_type, monkeypatch):
    """Each type's decoder step in one C call at width 1280 against the blocks called from Python."""
    model = wide_models[compute_type]
    if compute_type == "int8" and model.decoder.decoder_step is None:
        pytest.skip("the int8 type's step kernels are not built here (no compiler, or no AVX512-VNNI)")
    assert model.decoder.decoder_step is not None, "the one-call step refused width 1280"
    cross = cross_kv_of(model, SPEECH_DIR, ["en/jfk.flac"])
    for rows in (1, 5):
        fused = decode_steps(model.decoder, cross, rows, steps=3)
        with monkeypatch.context() as patch:
            patch.setattr(model.decoder, "decoder_step", None)
            twin = decode_steps(model.decoder, cross, rows, steps=3)
        assert torch.equal(fused[0], twin[0]), f"{rows} rows: logits differ"
        assert all(torch.equal(a, b) for a, b in zip(fused[1], twin[1], strict=True)), f"{rows} rows: Self-KV"
