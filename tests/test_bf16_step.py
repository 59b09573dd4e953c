"""The bfloat16 compute type (``cpu/bfloat16.py``): its linears' C kernel against their PyTorch twin
(close numbers; a row's bits never depend on the rows beside it), a block's and a whole step's one C
call with the call-by-call path's bits, the same words as its PyTorch twin and as float32 on real
speech, a digest of its own, a CPU without AVX512-BF16 declining the kernels cleanly, and the type
reached from the command line and faster-whisper's ``WhisperModel``."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import whisperkv
from tests.block_step_twins import assert_one_call_per_block_is_the_twin, cross_kv_of, decode_steps
from tests.conftest import INT8_CLIPS, SPEECH_DIR
from whisperkv.cpu import bf16_linear
from whisperkv.cpu.bf16_linear import Bfloat16Embedding, Bfloat16Linear, load_bf16_rows_kernel
from whisperkv.cpu.bf16_step import Bf16BlockStep, Bf16DecoderStep, Bf16StepRows
from whisperkv.cpu.bfloat16 import convert_bfloat16
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.metrics import normalize_text


def _load_bf16(**options) -> whisperkv.model.Whisper:
    model = whisperkv.load_model("tiny.en")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the twin's "no rows kernel here" warning
        return convert_bfloat16(model, **options)


@pytest.fixture(scope="module")
def bf16_model():
    model = whisperkv.load_model("tiny.en", compute_type="bfloat16")
    if not isinstance(model.decoder.blocks[0].step_rows, Bf16StepRows):
        pytest.skip("the bfloat16 rows kernel is not built here (no compiler, or no AVX512-BF16)")
    return model


@pytest.fixture(scope="module")
def twin_model():
    """The same type through PyTorch: no rows kernel, PyTorch's float32 products of its bfloat16 values."""
    return _load_bf16(rows_kernel=False)


@pytest.fixture(scope="module")
def jfk_cross(bf16_model, speech_dir):
    return cross_kv_of(bf16_model, speech_dir, ["en/jfk.flac"])


def _words(model, clips: tuple[str, ...] = INT8_CLIPS) -> list[list[str]]:  # noqa: ANN001
    audio = [whisperkv.load_audio(SPEECH_DIR / clip) for clip in clips]
    return [normalize_text(whisperkv.transcribe(model, a)["text"]).split() for a in audio]


@pytest.mark.parametrize(
    ("out", "width", "rows"), [(1152, 384, 1), (384, 384, 5), (200, 1280, 7), (51864, 64, 2)]
)
def test_the_kernel_is_its_twin_to_float32_rounding_and_each_row_its_own(out, width, rows):
    kernel = load_bf16_rows_kernel()
    if kernel is None:
        pytest.skip("no AVX512-BF16 or no compiler here")
    generator = torch.Generator().manual_seed(out + width)
    weight = torch.randn(out, width, generator=generator) * 0.05
    bias = torch.randn(out, generator=generator)
    x = torch.randn(rows, width, generator=generator)
    fast, twin = Bfloat16Linear(weight, bias, kernel), Bfloat16Linear(weight, bias)
    assert torch.equal(fast.weight, weight.to(torch.bfloat16)) and torch.equal(twin.weight, fast.weight)
    exact = x.to(torch.bfloat16).double() @ weight.to(torch.bfloat16).double().T + bias.double()
    # float32 sums of `width` products: within a few float32 roundings of the exact sum
    tolerance = 4 * math.sqrt(width) * 2**-24 * exact.abs().max().item()
    assert (fast(x).double() - exact).abs().max().item() <= tolerance
    assert (twin(x).double() - exact).abs().max().item() <= tolerance
    alone = torch.cat([fast(x[r : r + 1]) for r in range(rows)])
    assert torch.equal(fast(x), alone)  # a row's bits do not depend on the rows beside it


def test_the_token_table_is_read_from_the_vocabularys_packing(bf16_model, twin_model):
    tokens = torch.tensor([[0, 63, 64, 1002], [50256, 51863, 5, 440]])
    for model in (bf16_model, twin_model):
        embedding, projection = model.decoder.token_embedding, model.decoder.logits_projection
        assert isinstance(embedding, Bfloat16Embedding) and embedding.projection is projection
        assert torch.equal(embedding(tokens), projection.weight[tokens].float())
    assert torch.equal(bf16_model.decoder.token_embedding(tokens), twin_model.decoder.token_embedding(tokens))
    assert "token_embedding.projection._packed" not in bf16_model.state_dict()


def test_each_linear_with_its_epilogue(bf16_model):
    """Alone: the linear's own bits; + residual: the sum to rounding (-ffast-math); after the kernels'
    LayerNorm: the product of that LayerNorm's bits; GELU: within 5e-7 of the exact GELU."""
    block = bf16_model.decoder.blocks[1]
    rows = block.step_rows
    up = block.mlp[0]
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(5, up.in_features, generator=generator)
    residual = torch.randn(5, up.out_features, generator=generator)
    with torch.no_grad():
        assert torch.equal(rows.through(x, up), up(x))
        torch.testing.assert_close(
            rows.through(x, up, residual=residual), residual + up(x), rtol=1e-6, atol=1e-6
        )
        normed = rows.layer_norm(x, block.mlp_ln)
        expected = F.layer_norm(x, (x.shape[1],), block.mlp_ln.weight, block.mlp_ln.bias)
        torch.testing.assert_close(normed, expected, rtol=0, atol=1e-5)
        assert torch.equal(rows.through(x, up, norm=block.mlp_ln), up(normed))
        products = up(x).double()
        exact = products * 0.5 * (1 + torch.special.erf(products / math.sqrt(2)))
        torch.testing.assert_close(rows.through(x, up, gelu=True).double(), exact, rtol=0, atol=5e-7)
    assert not rows.takes(torch.nn.Linear(384, 384))


@pytest.mark.parametrize("rows", [1, 5])
def test_one_call_per_block_gives_the_twins_bits(bf16_model, jfk_cross, rows, monkeypatch):
    decoder = bf16_model.decoder
    assert decoder.new_cache(jfk_cross).self_kv[0].key.dtype == torch.bfloat16
    assert_one_call_per_block_is_the_twin(decoder, jfk_cross, rows, 6, Bf16BlockStep, monkeypatch)


def test_two_windows_of_ten_beams_in_one_call_per_block(bf16_model, speech_dir, monkeypatch):
    cross = cross_kv_of(bf16_model, speech_dir, ["en/jfk.flac", "en/ls_1089-134686-0000.flac"])
    assert_one_call_per_block_is_the_twin(bf16_model.decoder, cross, 20, 3, Bf16BlockStep, monkeypatch)


@pytest.mark.parametrize("rows", [1, 5])
def test_the_whole_step_in_one_call_gives_the_blocks_bits(bf16_model, jfk_cross, rows, monkeypatch):
    decoder = bf16_model.decoder
    assert type(decoder.decoder_step) is Bf16DecoderStep
    taken, logits = [], Bf16DecoderStep.logits
    monkeypatch.setattr(Bf16DecoderStep, "logits", lambda self, *a: taken.append(1) or logits(self, *a))
    fused = decode_steps(decoder, jfk_cross, rows, steps=6)
    assert len(taken) == 6
    with monkeypatch.context() as patch:
        patch.setattr(decoder, "decoder_step", None)
        twin = decode_steps(decoder, jfk_cross, rows, steps=6)
    assert len(taken) == 6
    assert torch.equal(fused[0], twin[0])
    assert all(torch.equal(a, b) for a, b in zip(fused[1], twin[1], strict=True))


def test_the_kernels_logits_are_closer_to_the_pytorch_twins_than_to_float32s(
    bf16_model, twin_model, tiny_model, jfk_cross, speech_dir
):
    """The same caches (the kernel model's Cross-KV), the same tokens fed: six steps' logits. Both round
    every linear's input to bfloat16, so a last-bit difference of a float32 sum (the kernels' LayerNorm
    and GELU against PyTorch's) can move a value to the neighbouring bfloat16: close, not equal.
    Measured: 0.015 apart on average (max 0.05), against 0.035 from float32's logits (max 0.13)."""
    assert twin_model.decoder.blocks[0].step_rows is None and twin_model.decoder.decoder_step is None
    fast, _ = decode_steps(bf16_model.decoder, jfk_cross, 1, steps=6)
    twin, _ = decode_steps(twin_model.decoder, jfk_cross, 1, steps=6)
    exact, _ = decode_steps(
        tiny_model.decoder, cross_kv_of(tiny_model, speech_dir, ["en/jfk.flac"]), 1, steps=6
    )
    assert torch.equal(fast.argmax(-1), twin.argmax(-1)) and torch.equal(fast.argmax(-1), exact.argmax(-1))
    apart, from_float32 = (fast - twin).abs(), (twin - exact).abs()
    assert apart.mean() < 0.6 * from_float32.mean() and apart.max() < 0.1


def test_same_words_as_its_twins_and_as_float32_on_real_speech(bf16_model, twin_model, tiny_model):
    fast = _words(bf16_model)
    assert fast == _words(twin_model)
    digest = bf16_model.weights_digest
    try:
        use_attention_kernels(bf16_model, rows=False)  # PyTorch between the kernels' linears
        assert all(b.step_rows is None and b.block_step is None for b in bf16_model.decoder.blocks)
        assert "linears kernel" not in bf16_model.weights_digest
        assert _words(bf16_model) == fast
    finally:
        use_attention_kernels(bf16_model)
    assert bf16_model.weights_digest == digest
    assert fast == _words(tiny_model)


def test_the_digest_names_the_type_and_its_kernels(bf16_model, twin_model, tiny_model, int8_model):
    digest = bf16_model.weights_digest
    assert digest.startswith(tiny_model.weights_digest.split("+")[0] + "+bfloat16(")
    assert "decoder rows kernel" in digest and "linears kernel" in digest and "bfloat16 caches" in digest
    assert (
        "decoder pytorch" in twin_model.weights_digest and "linears kernel" not in twin_model.weights_digest
    )
    assert len({digest, twin_model.weights_digest, tiny_model.weights_digest, int8_model.weights_digest}) == 4


def test_a_cpu_without_avx512_bf16_declines_the_kernels_and_runs_the_twin(monkeypatch, speech_dir):
    monkeypatch.setattr(bf16_linear, "cpu_has_avx512_bf16", lambda: False)
    assert load_bf16_rows_kernel() is None
    with pytest.warns(UserWarning, match="no bfloat16 rows kernel here"):
        model = whisperkv.load_model("tiny.en", compute_type="bfloat16")
    decoder = model.decoder
    assert model.compute_type == "bfloat16" and decoder.decoder_step is None
    assert all(b.step_rows is None and b.block_step is None for b in decoder.blocks)
    assert decoder.logits_projection.kernel is None and "decoder pytorch" in model.weights_digest
    text = model.transcribe(str(speech_dir / "en" / "jfk.flac"))["text"]
    assert "ask not what your country can do for you" in normalize_text(text)


def test_convert_refuses_a_model_already_converted(bf16_model):
    with pytest.raises(ValueError, match="already of the bfloat16 compute type"):
        convert_bfloat16(bf16_model)


def test_the_command_line_and_faster_whisper_api_take_bfloat16(bf16_model, monkeypatch, tmp_path, speech_dir):
    from whisperkv import cli, load
    from whisperkv.faster import WhisperModel

    loaded = []
    monkeypatch.setattr(load, "load_model", lambda *a, **k: loaded.append(k) or bf16_model)
    clip = speech_dir / "en" / "jfk.flac"
    argv = ["transcribe", str(clip), "--compute_type", "bfloat16", "--output_format", "txt"]
    assert cli.main([*argv, "--output_dir", str(tmp_path)]) == 0
    assert [k["compute_type"] for k in loaded] == ["bfloat16"]
    assert "ask not what your country" in (tmp_path / "jfk.txt").read_text().lower()
    model = WhisperModel("tiny.en", device="cpu", compute_type="bfloat16")
    assert [k["compute_type"] for k in loaded] == ["bfloat16", "bfloat16"]
    segments, _ = model.transcribe(str(clip), beam_size=1)
    assert "ask not what your country" in "".join(s.text for s in segments).lower()
