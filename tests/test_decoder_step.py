"""A whole decoder step in one C call (float32: ``cpu/decoder_step.py``, ``wkv_decoder_step``; int8:
``cpu/int8_decoder_step.py``): the same logits and Self-KV, bit for bit, as its twin (the blocks'
one-call steps, the final LayerNorm and the projection called from Python), for greedy, beam and
batched windows and whole transcriptions; the steps it does not take go the twin's way, and bad input
is refused before anything is written."""

from __future__ import annotations

import ctypes

import pytest
import torch

import whisperkv
from tests.block_step_twins import PROMPT, count_taken, cross_kv_of, decode_steps
from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.decoder_step import DecoderStep
from whisperkv.cpu.int8_decoder_step import Int8DecoderStep


@pytest.fixture(scope="module")
def jfk_cross(kernel_model, speech_dir):
    return cross_kv_of(kernel_model, speech_dir, ["en/jfk.flac"])


@pytest.fixture(scope="module", params=["float32", "int8"])
def stepped(request, speech_dir):
    """(model, jfk's Cross-KV) of each type: the int8 type's where its kernels build here."""
    model = request.getfixturevalue("kernel_model" if request.param == "float32" else "int8_model")
    if model.decoder.decoder_step is None:
        pytest.skip("the step kernels are not built here (no compiler; for int8, no AVX512-VNNI)")
    return model, cross_kv_of(model, speech_dir, ["en/jfk.flac"])


@pytest.fixture
def taken(monkeypatch):
    """How many steps ``DecoderStep`` computed (it returns None where it does not take them)."""
    return count_taken(monkeypatch, DecoderStep)


def _twin(decoder, cross, rows: int, steps: int, monkeypatch):  # noqa: ANN001, ANN202
    with monkeypatch.context() as patch:
        patch.setattr(decoder, "decoder_step", None)  # each block's one call, LayerNorm and projection
        return decode_steps(decoder, cross, rows, steps)


@pytest.mark.parametrize("rows", [1, 5])
def test_one_call_gives_the_twins_bits(stepped, monkeypatch, taken, rows):
    model, cross = stepped
    decoder = model.decoder
    kind = Int8DecoderStep if model.compute_type == "int8" else DecoderStep
    assert type(decoder.decoder_step) is kind
    fused = decode_steps(decoder, cross, rows, steps=8)
    assert taken == [True] * 8
    twin = _twin(decoder, cross, rows, 8, monkeypatch)
    assert taken == [True] * 8  # the twin did not call it
    assert torch.equal(fused[0], twin[0])
    assert all(torch.equal(a, b) for a, b in zip(fused[1], twin[1], strict=True))


def test_two_windows_of_ten_beams(kernel_model, speech_dir, monkeypatch, taken):
    """The batched mode's beam search: 20 rows over two windows' Cross-KV, in one call."""
    cross = cross_kv_of(kernel_model, speech_dir, ["en/jfk.flac", "en/ls_1089-134686-0000.flac"])
    fused = decode_steps(kernel_model.decoder, cross, 20, steps=3)
    assert taken == [True] * 3
    twin = _twin(kernel_model.decoder, cross, 20, 3, monkeypatch)
    assert torch.equal(fused[0], twin[0])
    assert all(torch.equal(a, b) for a, b in zip(fused[1], twin[1], strict=True))


def test_steps_it_does_not_take_go_the_twins_way(kernel_model, jfk_cross, monkeypatch, taken):
    """A block whose linear is held in float32 (no one-call struct for it): the whole step declines, the
    blocks step call by call, and the logits are the twin's."""
    decoder = kernel_model.decoder
    block = decoder.blocks[1]
    half = block.mlp[0].weight
    try:
        block.mlp[0].weight = torch.nn.Parameter(half.float(), requires_grad=False)
        block.block_step.forget(block)
        declined = decode_steps(decoder, jfk_cross, 1, steps=2)
        assert taken == [False, False]
    finally:
        block.mlp[0].weight = half
        block.block_step.forget(block)
    assert torch.equal(declined[0], _twin(decoder, jfk_cross, 1, 2, monkeypatch)[0])
    decode_steps(decoder, jfk_cross, 1, steps=1)
    assert taken[-1] is True  # the struct is made again from the float16 weight


def test_bad_input_is_refused_before_anything_is_written(stepped):
    model, cross = stepped
    decoder = model.decoder
    cache = decoder.new_cache(cross, batch_size=1)
    with torch.no_grad():
        decoder(torch.tensor([PROMPT]), cache)
        held = [kv.length for kv in cache.self_kv], cache.tokens.clone()
        with pytest.raises(ValueError, match="outside the vocabulary of 51864"):
            decoder.forward_rows([(torch.tensor([[51864]]), cache)])
        assert [kv.length for kv in cache.self_kv] == held[0]
        assert torch.equal(cache.tokens, held[1])
        for kv in cache.self_kv:  # a full text context: the twin's error
            kv.length = kv.capacity
        with pytest.raises(ValueError, match="text context is 448 tokens"):
            decoder.forward_rows([(torch.tensor([[1002]]), cache)])


def test_float16_values_widen_exactly():
    """The table's float16 values, every bit pattern, widened as PyTorch widens them."""
    widen = load_kernel().library.wkv_widen_half
    widen.restype, widen.argtypes = None, [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p]
    bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
    halves = bits.view(torch.float16)
    out = torch.empty(halves.shape[0])
    widen(halves.data_ptr(), halves.shape[0], out.data_ptr())
    expected = halves.float()
    nan = expected.isnan()
    assert torch.equal(out.isnan(), nan)
    assert torch.equal(out[~nan].view(torch.int32), expected[~nan].view(torch.int32))  # -0.0 included


@pytest.mark.parametrize(
    ("clip", "options"), [("en/jfk.flac", {}), ("en/lj_LJ001-0007.flac", {"beam_size": 5})]
)
def test_a_transcription_is_the_twins(stepped, speech_dir, monkeypatch, taken, clip, options):
    model, _ = stepped
    audio = whisperkv.load_audio(speech_dir / clip)
    fused = model.transcribe(audio, **options)
    assert taken and all(taken)
    with monkeypatch.context() as patch:
        patch.setattr(model.decoder, "decoder_step", None)
        twin = model.transcribe(audio, **options)
    assert fused == twin  # tokens, text, timestamps, avg_logprob: every field
