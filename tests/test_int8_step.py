"""The int8 type's step in C (``cpu/int8_step.py``): each linear with its LayerNorm, bias, GELU and
residual in one call (the twin), and a block's whole step in one call with the twin's bits, for a
greedy window and a beam-5 window; the steps it does not take go the twin's way, and the PyTorch path
(``rows=False``) stays as the slow twin with the same words."""

from __future__ import annotations

import ctypes
import math

import pytest
import torch
import torch.nn.functional as F

from tests.block_step_twins import PROMPT, assert_one_call_per_block_is_the_twin, cross_kv_of, decode_steps
from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.int8_decoder_step import use_int8_step
from whisperkv.cpu.int8_step import Int8BlockStep, Int8StepRows
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.metrics import normalize_text


@pytest.fixture(scope="module")
def int8_step_model(int8_model):
    if not isinstance(int8_model.decoder.blocks[0].step_rows, Int8StepRows):
        pytest.skip("the int8 rows kernel is not built here (no compiler, or no AVX512-VNNI)")
    return int8_model


@pytest.fixture(scope="module")
def jfk_cross(int8_step_model, speech_dir):
    return cross_kv_of(int8_step_model, speech_dir, ["en/jfk.flac"])


@pytest.fixture(scope="module")
def two_windows_cross(int8_step_model, speech_dir):
    """jfk and a LibriSpeech clip: a batched step's cache."""
    return cross_kv_of(int8_step_model, speech_dir, ["en/jfk.flac", "en/ls_1089-134686-0000.flac"])


@pytest.mark.parametrize("rows", [1, 5])
def test_one_call_per_block_gives_the_twins_bits(int8_step_model, jfk_cross, rows, monkeypatch):
    decoder = int8_step_model.decoder
    assert decoder.new_cache(jfk_cross).self_kv[0].key.dtype == torch.bfloat16
    assert_one_call_per_block_is_the_twin(decoder, jfk_cross, rows, 6, Int8BlockStep, monkeypatch)


def test_the_batched_modes_windows_take_it_past_16_rows(int8_step_model, two_windows_cross, monkeypatch):
    """Two windows of ten beams (20 rows): one call per block, the twin's bits."""
    decoder = int8_step_model.decoder
    assert_one_call_per_block_is_the_twin(decoder, two_windows_cross, 20, 3, Int8BlockStep, monkeypatch)


def test_two_caches_in_one_step_go_call_by_call_with_the_bits_of_each_alone(
    int8_step_model, jfk_cross, monkeypatch
):
    decoder = int8_step_model.decoder
    calls = []
    call = Int8BlockStep.__call__
    monkeypatch.setattr(Int8BlockStep, "__call__", lambda self, *args: calls.append(1) or call(self, *args))
    caches = [decoder.new_cache(jfk_cross) for _ in range(2)]
    with torch.no_grad():
        for cache in caches:
            decoder(torch.tensor([PROMPT]), cache)
        calls.clear()
        both = decoder.forward_rows([(torch.tensor([[1002]]), c) for c in caches])
    assert calls == []
    alone, _ = decode_steps(decoder, jfk_cross, 1, steps=1)
    assert torch.equal(both[0], alone[0, 0]) and torch.equal(both[1], alone[0, 0])


def _library_layer_norm(x: torch.Tensor, norm: torch.nn.LayerNorm) -> torch.Tensor:
    """The kernels' own LayerNorm (``wkv_layer_norm``), row by row."""
    fn = load_kernel().library.wkv_layer_norm
    fn.restype = None
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_long,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_float,
        ctypes.c_void_p,
    ]
    out = torch.empty_like(x)
    for r in range(x.shape[0]):
        fn(
            x[r].data_ptr(),
            x.shape[1],
            norm.weight.data_ptr(),
            norm.bias.data_ptr(),
            norm.eps,
            out[r].data_ptr(),
        )
    return out


def test_each_linear_is_the_int8_linear_with_its_epilogue(int8_step_model):
    """No epilogue: ``Int8Linear``'s own bits; + residual: PyTorch's sum to rounding (the kernel is built
    with -ffast-math: the adds may fuse); a LayerNorm first: the product of the kernels' LayerNorm
    (within 1e-5 of PyTorch's); GELU: within 5e-7 of the exact GELU of the same products."""
    block = int8_step_model.decoder.blocks[1]
    rows = block.step_rows
    up, down = block.mlp[0], block.mlp[2]
    x = torch.randn(5, up.in_features, generator=torch.Generator().manual_seed(7))
    residual = torch.randn(5, up.out_features, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        assert torch.equal(rows.through(x, up), up(x))
        with_residual = rows.through(x, up, residual=residual)  # -ffast-math: the adds may fuse
        torch.testing.assert_close(with_residual, residual + up(x), rtol=1e-6, atol=1e-6)
        normed = _library_layer_norm(x, block.mlp_ln)
        torch.testing.assert_close(
            normed, F.layer_norm(x, (x.shape[1],), block.mlp_ln.weight, block.mlp_ln.bias), rtol=0, atol=1e-5
        )
        assert torch.equal(rows.through(x, up, norm=block.mlp_ln), up(normed))
        products = up(x).double()
        exact = products * 0.5 * (1 + torch.special.erf(products / math.sqrt(2)))  # PyTorch's: 1e-6 off
        torch.testing.assert_close(rows.through(x, up, gelu=True).double(), exact, rtol=0, atol=5e-7)
        hidden = torch.randn(3, down.in_features)
        assert torch.equal(rows.through(hidden, down), down(hidden))
    assert not rows.takes(torch.nn.Linear(384, 384))


def test_the_pytorch_twin_is_named_in_the_digest_and_gives_the_same_words(int8_step_model, speech_dir):
    model = int8_step_model
    clip = str(speech_dir / "en" / "jfk.flac")
    fast = model.transcribe(clip)["text"]
    digest = model.weights_digest
    assert "linears kernel" in digest
    try:
        use_attention_kernels(model, rows=False)
        assert all(b.step_rows is None and b.block_step is None for b in model.decoder.blocks)
        assert "linears kernel" not in model.weights_digest
        twin = model.transcribe(clip)["text"]
    finally:
        use_attention_kernels(model)
    assert model.weights_digest == digest
    assert normalize_text(fast).split() == normalize_text(twin).split()


def test_a_decoder_with_a_linear_the_kernel_cannot_take_keeps_pytorch(int8_step_model):
    decoder = int8_step_model.decoder
    block = decoder.blocks[2]
    kernel = block.mlp[0].kernel
    try:
        block.mlp[0].kernel = None  # as if fbgemm held it
        assert use_int8_step(decoder) is None
        assert all(b.step_rows is None and b.block_step is None for b in decoder.blocks)
    finally:
        block.mlp[0].kernel = kernel
        use_int8_step(decoder)
    assert all(isinstance(b.block_step, Int8BlockStep) for b in decoder.blocks)
