"""The int8 type's bfloat16 encoder linears and convolutions in AMX's tiles (``cpu/tiled_linear.py``):
PyTorch's numbers (addmm or its convolution, then its bfloat16 GELU or add) but where a sum or GELU's far
negative tail rounds the other way, a row's numbers its own, only what it computes taken, weights packed
again when they change, and the int8 type's encoder and transcripts with them those of its twin, the
PyTorch block."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import SPEECH_DIR, assert_rows_are_their_own, int8_words
from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.cpu.tiled_linear import (
    BIAS,
    GELU,
    GELU_RESIDUAL,
    RESIDUAL,
    EncoderBlockTiles,
    EncoderFrontTiles,
    PackedLinear,
    TiledEncoderLinear,
)
from whisperkv.metrics import word_errors


@pytest.fixture(scope="module")
def tiles() -> TiledEncoderLinear:
    kernel = load_kernel()
    if kernel is None or not TiledEncoderLinear.available(kernel.library):
        pytest.skip(
            "no AMX bfloat16 tiles on this CPU (or no C compiler): the encoder keeps PyTorch's linears"
        )
    return TiledEncoderLinear(kernel.library)


def _layer(rows: int, k: int, n: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, k, generator=g) * 1.5).bfloat16()
    weight = (torch.randn(n, k, generator=g) / math.sqrt(k)).bfloat16()
    bias = (torch.randn(n, generator=g) * 0.5).bfloat16()
    residual = torch.randn(rows, n, generator=g).bfloat16()
    return x, weight, bias, residual


def _pytorch(x, weight, bias, epilogue, residual):
    """What the PyTorch block computes (the twin): addmm, then GELU and/or the residual add, in bfloat16."""
    y = F.linear(x, weight, bias)
    y = F.gelu(y) if epilogue in (GELU, GELU_RESIDUAL) else y
    return residual + y if epilogue in (RESIDUAL, GELU_RESIDUAL) else y


# tiny.en's and base's four encoder linears, a few rows, rows past a block of 32, one row
SHAPES = [(1500, 384, 1152), (1500, 384, 384), (1500, 384, 1536), (1500, 1536, 384), (1500, 512, 2048)]
SHAPES += [(1500, 2048, 512), (33, 384, 1536), (31, 64, 32), (1, 32, 64)]


@pytest.mark.parametrize("rows,k,n", SHAPES)
@pytest.mark.parametrize("epilogue", [BIAS, GELU, RESIDUAL, GELU_RESIDUAL])
def test_pytorchs_numbers_but_for_a_sum_or_gelus_tail_rounding_the_other_way(tiles, rows, k, n, epilogue):
    """Every block of 32 rows and columns, tails of fewer: the output is PyTorch's bfloat16 number for
    all but a few elements, and those are the last bit of a rounding apart (a wrong pair, tile or row
    would be far off)."""
    x, weight, bias, residual = _layer(rows, k, n, seed=rows + k + n + epilogue)
    got = tiles(x, PackedLinear.of(weight, bias), epilogue, residual)
    want = _pytorch(x, weight, bias, epilogue, residual)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    differ = got != want
    assert differ.float().mean() <= (0.001 if epilogue in (BIAS, RESIDUAL) else 0.01), differ.float().mean()
    # a sum rounded one bfloat16 step the other way, carried through GELU or the add: two steps at most
    # of the larger of the output and the linear's own output
    scale = torch.maximum(want.float().abs(), F.linear(x, weight, bias).float().abs()).clamp_min(1e-3)
    assert ((got.float() - want.float()).abs() <= scale * 2**-6).all()


def test_gelus_differences_lie_in_its_cancelling_tail_and_are_nearer_the_exact_value(tiles):
    """Where 1 + erf(x) cancels (x far below 0) the kernel's erf and PyTorch's round GELU differently;
    nowhere else. There the kernel's is the nearer to GELU computed in float64."""
    x, weight, bias, residual = _layer(1500, 384, 1536, seed=7)
    packed = PackedLinear.of(weight, bias)
    pre = tiles(x, packed, BIAS)
    got, want = tiles(x, packed, GELU), F.gelu(pre)
    differ = got != want
    assert differ.any() and (pre[differ].float() < -2).all()
    z = pre[differ].double()
    exact = 0.5 * z * (1 + torch.special.erf(z / math.sqrt(2)))
    assert (got[differ].double() - exact).abs().mean() < (want[differ].double() - exact).abs().mean()


def test_gelu_far_out_either_way_is_pytorchs(tiles):
    """Pre-activations far from 0, to bfloat16's largest: GELU is the input above 0 and 0 below, as
    PyTorch's (the exponent of erf's tail, e^(-x^2), once overflowed its range reduction to inf or NaN)."""
    magnitudes = torch.tensor([4.0, 6.0, 10.0, 14.0, 1e2, 1e4, 7.1e6, 1e20, 1e38])
    x = torch.cat([magnitudes, -magnitudes, torch.zeros(32 - 2 * len(magnitudes))]).bfloat16()
    identity = torch.eye(32, dtype=torch.bfloat16)
    got = tiles(x.repeat(32, 1), PackedLinear.of(identity, None), GELU)
    want = F.gelu(x).repeat(32, 1)
    assert torch.isfinite(got).all() and torch.equal(got, want), got[0]


def test_a_rows_numbers_are_its_own_with_one_thread_or_two(tiles):
    x, weight, bias, residual = _layer(3 * 1500, 384, 1536, seed=3)
    packed = PackedLinear.of(weight, bias)
    assert_rows_are_their_own(lambda rows: tiles(rows, packed, GELU), x)


def test_it_takes_only_what_it_computes(tiles):
    x, weight, bias, residual = _layer(40, 384, 384, seed=4)
    packed = PackedLinear.of(weight, bias)
    with pytest.raises(ValueError, match="bfloat16"):
        tiles(x.float(), packed)
    with pytest.raises(ValueError, match="bfloat16"):
        tiles(x[:, :352], packed)  # the wrong width
    with pytest.raises(ValueError, match="residual"):
        tiles(x, packed, RESIDUAL)  # no residual
    with pytest.raises(ValueError, match="residual"):
        tiles(x, packed, RESIDUAL, residual[:, :32])
    assert TiledEncoderLinear.takes(torch.nn.Linear(384, 1536).bfloat16())
    assert not TiledEncoderLinear.takes(torch.nn.Linear(384, 1536))  # float32: PyTorch's
    assert not TiledEncoderLinear.takes(torch.nn.Linear(80, 384).bfloat16())  # not a multiple of 32


def test_the_convolutions_in_tiles_are_pytorchs_but_for_a_sum_rounding_the_other_way(
    tiles, int8_bf16_encoder_model
):
    """The encoder's front (two convolutions read as overlapping rows, GELUs, positions) against PyTorch's
    convolutions: two windows, each its own numbers, and PyTorch's but for a few elements a rounding away."""
    _tiled(int8_bf16_encoder_model)
    encoder, front = int8_bf16_encoder_model.encoder, int8_bf16_encoder_model.encoder.front
    assert isinstance(front, EncoderFrontTiles)
    g = torch.Generator().manual_seed(5)
    mel = (torch.randn(2, 80, 3000, generator=g) * 0.5).bfloat16()
    with torch.no_grad():
        got, want = front.forward(encoder, mel), encoder.convolutions(mel)
        alone = front.forward(encoder, mel[1:])
        convolved = F.gelu(encoder.conv2(F.gelu(encoder.conv1(mel)))).transpose(1, 2).float().abs()
    assert got.shape == want.shape == (2, 1500, 384) and got.dtype == torch.bfloat16
    assert torch.equal(alone, got[1:])
    assert (got != want).float().mean() < 0.001
    # a sum one bfloat16 step the other way, through GELU and the positions' add: two steps at most of
    # the larger of the output and the convolution's own
    scale = torch.maximum(want.float().abs(), convolved).clamp_min(1e-3)
    assert ((got.float() - want.float()).abs() <= scale * 2**-6).all()
    assert not front.accepts(mel.float()) and not front.accepts(mel[..., :2998])
    with pytest.raises(ValueError, match="3000 Mel frames"):  # the twin's words for a window not 30 s
        encoder(mel[..., :2998])


def _encoders(model, mel):
    outputs = {}
    try:
        for linears in (True, False):
            use_attention_kernels(model, linears=linears)
            outputs[linears] = model.embed_audio(mel)
    finally:
        use_attention_kernels(model)
    return outputs


@pytest.fixture(scope="module")
def mel() -> torch.Tensor:
    import whisperkv
    from whisperkv.audio import log_mel_spectrogram, pad_or_trim

    audio = whisperkv.load_audio(SPEECH_DIR / "en" / "jfk.flac")
    return log_mel_spectrogram(pad_or_trim(audio)).unsqueeze(0)


def _tiled(model) -> None:
    if model.encoder.blocks[0].tiles is None:
        pytest.skip("this int8 model's encoder linears are not in tiles here")


def test_the_int8_encoder_is_as_close_to_float32_with_them_as_without(
    tiles, int8_bf16_encoder_model, tiny_model, mel
):
    _tiled(int8_bf16_encoder_model)
    assert "linears tiles, convolutions tiles" in int8_bf16_encoder_model.weights_digest
    with torch.no_grad():
        want = tiny_model.embed_audio(mel)
        outputs = _encoders(int8_bf16_encoder_model, mel.bfloat16())
    ours, twin = ((outputs[on].float() - want).abs().mean() for on in (True, False))
    assert ours <= 1.05 * twin, (ours, twin)
    assert not torch.equal(outputs[True], outputs[False])  # GELU's tail: other numbers, another digest


def test_weights_changed_after_packing_are_packed_again(tiles, int8_bf16_encoder_model, mel):
    """A packed copy must never outlive the weights it was made from: a convolution's bias changed in
    place, or a linear's weight given back, changed and planned again, and the tiles compute with the
    new one (as the twin does)."""
    _tiled(int8_bf16_encoder_model)
    model = copy.deepcopy(int8_bf16_encoder_model)
    assert isinstance(model.encoder.blocks[0].tiles, EncoderBlockTiles)
    with torch.no_grad():
        before = model.embed_audio(mel.bfloat16())
        use_attention_kernels(model, linears=False)
        model.encoder.blocks[1].mlp[2].weight.mul_(0.5)
        model.encoder.conv2.bias.add_(0.25)
        use_attention_kernels(model)
        after = _encoders(model, mel.bfloat16())
    assert not torch.equal(after[True], before)
    assert (after[True].float() - after[False].float()).abs().mean() < 0.02


def test_the_tiles_hold_the_only_copy_of_the_linears_and_give_it_back_exactly(tiles, int8_bf16_encoder_model):
    """Held by the tiles, the block's linears are shapes on the meta device (1.26 GB of large-v3-turbo's
    encoder not held twice); given back, the same bits; a weight changed in place meanwhile is refused."""
    _tiled(int8_bf16_encoder_model)
    model = copy.deepcopy(int8_bf16_encoder_model)
    use_attention_kernels(model, linears=False)
    block = model.encoder.blocks[0]
    weights = [layer.weight.clone() for layer in (block.attn.query, block.attn.value, block.mlp[0])]
    use_attention_kernels(model)
    assert all(layer.weight.is_meta for layer in (block.attn.query, block.attn.out, block.mlp[2]))
    assert block.attn.qkv is None and isinstance(block.tiles, EncoderBlockTiles)
    state = model.state_dict()  # the numbers, unpacked from the tiles
    assert torch.equal(state["encoder.blocks.0.attn.query.weight"], weights[0])
    assert torch.equal(state["encoder.blocks.0.mlp.0.weight"], weights[2])
    use_attention_kernels(model, linears=False)
    again = [layer.weight for layer in (block.attn.query, block.attn.value, block.mlp[0])]
    assert all(torch.equal(a, b) for a, b in zip(again, weights))
    assert block.attn.query.weight.data_ptr() == block.attn.qkv.keywords["weight"].data_ptr()  # views
    use_attention_kernels(model)
    with torch.no_grad():
        block.mlp[2].weight.mul_(0.5)  # meta: nothing computes, the tiles keep the old numbers
    with pytest.raises(ValueError, match=r"mlp\.2 weight was changed in place"):
        use_attention_kernels(model, linears=False)


def test_the_int8_types_transcripts_with_them_are_the_twins(tiles, int8_bf16_encoder_model):
    """Real speech, the int8 type's whole model: its words with the tiled linears and with PyTorch's. An
    approximation's words, so a few may differ: on round 19's Xeon, ls_1089-134686-0000's "fattened sauce"
    came out "fat and sauce" with the tiles and "fatened sauce" without (two edits); jfk's are equal."""
    _tiled(int8_bf16_encoder_model)
    texts = {on: int8_words(int8_bf16_encoder_model, linears=on) for on in (True, False)}
    assert texts[True][0] == texts[False][0]  # jfk
    assert sum(word_errors(a, b)[0] for a, b in zip(texts[False], texts[True], strict=True)) <= 2, texts
