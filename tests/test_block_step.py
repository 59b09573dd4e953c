"""A decoder block's step in one C call (``cpu/block_step.py``, ``kernels/block_step.c``): the same
logits and Self-KV, bit for bit, as its twin (the same kernels called one by one from Python), for a
greedy window and a beam-5 window; the steps it does not take go the twin's way."""

from __future__ import annotations

import pytest
import torch

import whisperkv
from tests.block_step_twins import PROMPT, assert_one_call_per_block_is_the_twin, cross_kv_of, decode_steps
from whisperkv.cpu.block_step import BlockStep, use_block_step
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.cpu.step_rows import StepRowsKernel


@pytest.fixture(scope="module")
def jfk_cross(kernel_model, speech_dir):
    return cross_kv_of(kernel_model, speech_dir, ["en/jfk.flac"])


@pytest.fixture(scope="module")
def two_windows_cross(kernel_model, speech_dir):
    """jfk and a LibriSpeech clip: a batched step's cache."""
    return cross_kv_of(kernel_model, speech_dir, ["en/jfk.flac", "en/ls_1089-134686-0000.flac"])


@pytest.mark.parametrize("rows", [1, 5])
def test_one_call_per_block_gives_the_twins_bits(kernel_model, jfk_cross, monkeypatch, rows):
    assert_one_call_per_block_is_the_twin(kernel_model.decoder, jfk_cross, rows, 6, BlockStep, monkeypatch)


def test_the_batched_modes_windows_take_it_past_16_rows(kernel_model, two_windows_cross, monkeypatch):
    """Two windows of ten beams (20 rows, 10 a window: the batched mode's beam search) in one call per
    block, with the twin's bits: the attention kernel's 16-row limit is per window."""
    assert_one_call_per_block_is_the_twin(
        kernel_model.decoder, two_windows_cross, 20, 3, BlockStep, monkeypatch
    )


def test_steps_it_does_not_take_go_the_twins_way(kernel_model, jfk_cross, monkeypatch):
    """Two caches in one step (a server's batch), and a model whose linears are float32: the
    call-by-call path, with the bits it gives alone."""
    decoder = kernel_model.decoder
    calls = []
    call = BlockStep.__call__
    monkeypatch.setattr(BlockStep, "__call__", lambda self, *args: calls.append(1) or call(self, *args))
    caches = [decoder.new_cache(jfk_cross) for _ in range(2)]
    with torch.no_grad():
        for cache in caches:
            decoder(torch.tensor([PROMPT]), cache)
        calls.clear()
        both = decoder.forward_rows([(torch.tensor([[1002]]), c) for c in caches])
    assert calls == []
    alone, _ = decode_steps(decoder, jfk_cross, 1, steps=1)
    assert torch.equal(both[0], alone[0, 0]) and torch.equal(both[1], alone[0, 0])

    block = decoder.blocks[0]
    half = block.mlp[0].weight
    try:
        block.mlp[0].weight = torch.nn.Parameter(half.float(), requires_grad=False)
        use_block_step(decoder)  # weights replaced by hand: the structs are made again
        assert block.block_step.parameters(block) is None
        calls.clear()
        float32_linear, _ = decode_steps(decoder, jfk_cross, 1, steps=2)
        assert len(calls) == 2 * (len(decoder.blocks) - 1)  # the other blocks still take it
    finally:
        block.mlp[0].weight = half
        use_block_step(decoder)
    assert block.block_step.parameters(block) is not None
    assert torch.equal(float32_linear, decode_steps(decoder, jfk_cross, 1, steps=2)[0])


def test_a_full_self_kv_is_refused_not_overrun(kernel_model, jfk_cross):
    block = kernel_model.decoder.blocks[0]
    self_kv = kernel_model.decoder.new_cache(jfk_cross).self_kv[0]
    self_kv.grow(self_kv.capacity)
    x = torch.randn(1, 1, block.attn.query.weight.shape[1])
    assert not block.block_step.takes(block, x, [1], self_kv, jfk_cross[0])
    with pytest.raises(ValueError, match="is full"), torch.no_grad():
        block.forward_rows(x, [1], [self_kv], [jfk_cross[0]])


def test_a_moved_or_quantised_model_drops_its_structs(speech_dir):
    """``.float()`` after a step makes the blocks' structs again (the tensors are new); a float32 model
    quantised after loading steps through the int8 type's own paths, with the int8 type's tokens."""
    from whisperkv.cpu.quantize import quantize_int8

    model = whisperkv.load_model("tiny.en")
    use_attention_kernels(model, rows=True)  # the kernels on, whatever the CPU
    clip = str(speech_dir / "en" / "jfk.flac")
    before = [s["tokens"] for s in model.transcribe(clip)["segments"]]
    step = model.decoder.blocks[0].block_step
    assert id(model.decoder.blocks[0]) in step._prepared
    model.float()
    assert id(model.decoder.blocks[0]) not in step._prepared
    assert [s["tokens"] for s in model.transcribe(clip)["segments"]] == before
    quantize_int8(model)
    from whisperkv.cpu.int8_step import Int8BlockStep, Int8StepRows

    assert all(
        type(b.step_rows) is not StepRowsKernel and type(b.block_step) is not BlockStep
        for b in model.decoder.blocks
    )
    assert all(b.step_rows is None or isinstance(b.step_rows, Int8StepRows) for b in model.decoder.blocks)
    assert all(b.block_step is None or isinstance(b.block_step, Int8BlockStep) for b in model.decoder.blocks)
    int8 = whisperkv.load_model("tiny.en", compute_type="int8")
    assert [s["tokens"] for s in model.transcribe(clip)["segments"]] == [
        s["tokens"] for s in int8.transcribe(clip)["segments"]
    ]
