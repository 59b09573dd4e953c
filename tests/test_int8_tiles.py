"""The int8 type's int8 encoder linears in AMX's int8 tiles (``cpu/int8_tiles.py``): the kernel's
numbers are its PyTorch twin's (each row quantised on its own, exact integer products) but for a
rounding, a row's numbers its own, the int8 weights held once, and the encoder and transcripts with
them close to the twin's and to float32's."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import SPEECH_DIR, assert_rows_are_their_own, int8_words
from whisperkv.cpu import quantize
from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.int8_tiles import (
    EncoderBlockInt8Tiles,
    Int8TileLinear,
    fits_int8_tiles,
    int8_tiles_available,
)
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.cpu.tiled_linear import BIAS, GELU, GELU_RESIDUAL, RESIDUAL, TiledEncoderLinear


@pytest.fixture(scope="module")
def tiles() -> TiledEncoderLinear:
    if not int8_tiles_available():
        pytest.skip("no AMX int8 tiles on this CPU (or no C compiler): the int8 type's encoder is another")
    return TiledEncoderLinear(load_kernel().library)


def _layer(rows: int, k: int, n: int, seed: int) -> tuple[Int8TileLinear, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=g) / math.sqrt(k)
    layer = Int8TileLinear(weight, torch.randn(n, generator=g) * 0.5)
    x = (torch.randn(rows, k, generator=g) * 1.5).bfloat16()
    return layer, x, torch.randn(rows, n, generator=g).bfloat16()


def _twin(layer: Int8TileLinear, x: torch.Tensor, epilogue: int, residual: torch.Tensor) -> torch.Tensor:
    y = layer(x)
    y = F.gelu(y) if epilogue in (GELU, GELU_RESIDUAL) else y
    return residual + y if epilogue in (RESIDUAL, GELU_RESIDUAL) else y


# tiny.en's and base's four encoder linears, large-v3-turbo's MLP, rows past a block of 32, one row
SHAPES = [(1500, 384, 1152), (1500, 1536, 384), (1500, 512, 2048), (300, 1280, 5120), (33, 384, 1536)]
SHAPES += [(31, 64, 32), (1, 128, 64)]


@pytest.mark.parametrize("rows,k,n", SHAPES)
@pytest.mark.parametrize("epilogue", [BIAS, GELU, RESIDUAL, GELU_RESIDUAL])
def test_the_twins_numbers_but_for_a_rounding(tiles, rows, k, n, epilogue):
    """Every block of 32 rows and columns, tails of fewer: the twin's bfloat16 number but for a few
    elements (a product and sum fused where the twin rounds twice, GELU's far tail), those a bfloat16
    step or two apart (a wrong tile, pair, scale or zero point would be far off)."""
    layer, x, residual = _layer(rows, k, n, seed=rows + k + n + epilogue)
    got = tiles(x, layer, epilogue, residual)
    want = _twin(layer, x, epilogue, residual)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape == (rows, n)
    differ = (got != want).float().mean()
    assert differ <= (0.001 if epilogue in (BIAS, RESIDUAL) else 0.02), differ
    scale = torch.maximum(want.float().abs(), layer(x).float().abs()).clamp_min(1e-2)
    assert ((got.float() - want.float()).abs() <= scale * 2**-5).all()


def test_the_product_is_close_to_float32s(tiles):
    """The approximation itself: 8-bit rows and weights against the float32 product."""
    g = torch.Generator().manual_seed(9)
    weight = torch.randn(1536, 384, generator=g) / math.sqrt(384)
    layer = Int8TileLinear(weight, None)
    x = torch.randn(1500, 384, generator=g).bfloat16()
    exact = x.float() @ weight.T
    error = (tiles(x, layer).float() - exact).abs().mean() / exact.abs().mean()
    assert 1e-3 < error < 0.02, error  # int8, not bfloat16's 2e-3 nor an exact product


def test_a_rows_numbers_are_its_own_with_one_thread_or_two(tiles):
    layer, x, _ = _layer(3 * 1500, 384, 1536, seed=3)
    assert_rows_are_their_own(lambda rows: tiles(rows, layer, GELU), x)


def test_the_layer_holds_its_weights_as_int8_once(tiles):
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(128, 64, generator=g)
    layer = Int8TileLinear(weight.half(), None)  # a float16 checkpoint's rows: the same int8 numbers
    assert layer.packed.dtype == torch.int8 and layer.packed.numel() == 128 * 64 and layer.nbytes == 8192
    want = torch.round(weight / (weight.abs().amax(dim=1, keepdim=True) / 127)).clamp(-127, 127)
    assert (layer.weights().float() - want).abs().max() <= 1  # float16's rounding moves a few by one
    assert torch.equal(layer.row_sums, layer.weights().sum(dim=1, dtype=torch.int32))
    assert not fits_int8_tiles(96) and fits_int8_tiles(128)  # 96 inputs: not whole steps of 64


@pytest.fixture(scope="module")
def tiles_model(tiles):
    """tiny.en as the int8 type with the int8 tiles encoder."""
    import whisperkv

    model = whisperkv.load_model("tiny.en", compute_type="float32")
    return quantize.quantize_int8(model, encoder="int8 tiles")


@pytest.fixture(scope="module")
def mel() -> torch.Tensor:
    import whisperkv
    from whisperkv.audio import log_mel_spectrogram, pad_or_trim

    audio = whisperkv.load_audio(SPEECH_DIR / "en" / "jfk.flac")
    return log_mel_spectrogram(pad_or_trim(audio)).unsqueeze(0)


def test_the_plan_runs_the_blocks_in_int8_tiles_and_names_them(tiles_model):
    assert "encoder int8 tiles" in tiles_model.weights_digest
    assert "linears int8 tiles, convolutions tiles" in tiles_model.weights_digest
    blocks = tiles_model.encoder.blocks
    assert all(isinstance(block.tiles, EncoderBlockInt8Tiles) for block in blocks)
    assert all(isinstance(block.mlp[0], Int8TileLinear) for block in blocks)
    assert not [name for name, p in blocks.named_parameters() if p.dim() == 2]  # no float weights left
    assert tiles_model.encoder_dtype == torch.bfloat16


def test_the_encoder_is_its_twins_and_near_float32(tiles_model, tiny_model, mel):
    model = copy.deepcopy(tiles_model)
    with torch.no_grad():
        want = tiny_model.embed_audio(mel)
        ours = model.embed_audio(mel)
        use_attention_kernels(model, linears=False)  # the PyTorch block over the same int8 layers
        assert all(block.tiles is None for block in model.encoder.blocks)
        twin = model.embed_audio(mel)
    errors = [(out.float() - want).abs().mean() / want.abs().mean() for out in (ours, twin)]
    print("relative errors against float32, kernel and twin:", errors)
    assert errors[0] <= 1.05 * errors[1] and errors[0] < 0.05, errors  # int8: as near as its twin
    assert (ours.float() - twin.float()).abs().mean() < errors[1] * want.abs().mean()  # nearer each other


def test_the_transcripts_with_them_are_the_twins(tiles_model):
    texts = {on: int8_words(tiles_model, linears=on) for on in (True, False)}
    assert texts[True][0] == texts[False][0]  # jfk
    assert "ask what you can do for your country" in texts[True][0]


def test_the_int8_tiles_encoder_is_refused_by_name_where_it_cannot_run(monkeypatch):
    import whisperkv

    monkeypatch.setattr(quantize, "int8_tiles_available", lambda: False)
    model = whisperkv.load_model("tiny.en", compute_type="float32")
    with pytest.raises(ValueError, match="unavailable int8 encoder 'int8 tiles'"):
        quantize.quantize_int8(model, encoder="int8 tiles")
