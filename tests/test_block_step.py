"""A decoder block's step in one C call (``model/block_step.py``, ``kernels/block_step.c``): the same
logits and Self-KV, bit for bit, as its twin (the same kernels called one by one from Python), for a
greedy window and a beam-5 window; the steps it does not take go the twin's way."""

from __future__ import annotations

import pytest
import torch

import whisperkv
from whisperkv.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim
from whisperkv.model.block_step import BlockStep, use_block_step
from whisperkv.model.step_rows import StepRowsKernel

PROMPT = [50257, 50362, 440]


@pytest.fixture(scope="module")
def jfk_cross(tiny_model, speech_dir):
    mel = pad_or_trim(log_mel_spectrogram(whisperkv.load_audio(speech_dir / "en" / "jfk.flac")), N_FRAMES)
    with torch.no_grad():
        features = tiny_model.embed_audio(mel[None])
        return tiny_model.decoder.project_cross_kv(features, tiny_model.encoder_provenance(mel[None]))


@pytest.fixture(scope="module")
def two_windows_cross(tiny_model, speech_dir):
    """The Cross-KV of two windows (jfk and a LibriSpeech clip): a batched step's cache."""
    model = tiny_model
    clips = ["en/jfk.flac", "en/ls_1089-134686-0000.flac"]
    mel = torch.stack(
        [pad_or_trim(log_mel_spectrogram(whisperkv.load_audio(speech_dir / c)), N_FRAMES) for c in clips]
    )
    with torch.no_grad():
        return model.decoder.project_cross_kv(model.embed_audio(mel), model.encoder_provenance(mel))


def _decode(decoder, cross, rows: int, steps: int = 6):
    """Logits of ``steps`` steps (each row taking its best token) and the Self-KVs' keys and values."""
    cache = decoder.new_cache(cross, batch_size=rows)
    with torch.no_grad():
        decoder(torch.tensor([PROMPT] * rows), cache)
        tokens = torch.tensor([[1002 + i] for i in range(rows)])
        logits = []
        for _ in range(steps):
            out = decoder.forward_rows([(tokens, cache)])
            logits.append(out)
            tokens = out.argmax(-1, keepdim=True)
    held = [torch.cat([kv.key, kv.value]) for kv in cache.self_kv]
    return torch.stack(logits), held


@pytest.mark.parametrize("rows", [1, 5])
def test_one_call_per_block_gives_the_twins_bits(tiny_model, jfk_cross, monkeypatch, rows):
    decoder = tiny_model.decoder
    assert all(isinstance(block.block_step, BlockStep) for block in decoder.blocks)
    calls = []
    call = BlockStep.__call__
    monkeypatch.setattr(BlockStep, "__call__", lambda self, *args: calls.append(1) or call(self, *args))
    fused = _decode(decoder, jfk_cross, rows)
    assert len(calls) == 6 * len(decoder.blocks)  # every step of every block went through it
    try:
        use_block_step(decoder, on=False)
        twin = _decode(decoder, jfk_cross, rows)
    finally:
        use_block_step(decoder)
    assert len(calls) == 6 * len(decoder.blocks)
    assert torch.equal(fused[0], twin[0])
    assert all(torch.equal(a, b) for a, b in zip(fused[1], twin[1], strict=True))


def test_steps_it_does_not_take_go_the_twins_way(tiny_model, jfk_cross, monkeypatch):
    """Two caches in one step (a server's batch), and a model whose linears are float32: the
    call-by-call path, with the bits it gives alone."""
    decoder = tiny_model.decoder
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
    alone, _ = _decode(decoder, jfk_cross, 1, steps=1)
    assert torch.equal(both[0], alone[0, 0]) and torch.equal(both[1], alone[0, 0])

    block = decoder.blocks[0]
    half = block.mlp[0].weight
    try:
        block.mlp[0].weight = torch.nn.Parameter(half.float(), requires_grad=False)
        use_block_step(decoder)  # weights replaced by hand: the structs are made again
        assert block.block_step.parameters(block) is None
        calls.clear()
        float32_linear, _ = _decode(decoder, jfk_cross, 1, steps=2)
        assert len(calls) == 2 * (len(decoder.blocks) - 1)  # the other blocks still take it
    finally:
        block.mlp[0].weight = half
        use_block_step(decoder)
    assert block.block_step.parameters(block) is not None
    assert torch.equal(float32_linear, _decode(decoder, jfk_cross, 1, steps=2)[0])


def test_a_full_self_kv_is_refused_not_overrun(tiny_model, jfk_cross):
    block = tiny_model.decoder.blocks[0]
    self_kv = tiny_model.decoder.new_cache(jfk_cross).self_kv[0]
    self_kv.grow(self_kv.capacity)
    x = torch.randn(1, 1, block.attn.query.weight.shape[1])
    assert not block.block_step.takes(block, x, [1], self_kv, jfk_cross[0])
    with pytest.raises(ValueError, match="is full"), torch.no_grad():
        block.forward_rows(x, [1], [self_kv], [jfk_cross[0]])


def test_a_moved_or_quantised_model_drops_its_structs(speech_dir):
    """``.float()`` after a step makes the blocks' structs again (the tensors are new); a float32 model
    quantised after loading steps through the int8 type's own paths, with the int8 type's tokens."""
    from whisperkv.model.quantize import quantize_int8

    model = whisperkv.load_model("tiny.en")
    clip = str(speech_dir / "en" / "jfk.flac")
    before = [s["tokens"] for s in model.transcribe(clip)["segments"]]
    step = model.decoder.blocks[0].block_step
    assert id(model.decoder.blocks[0]) in step._prepared
    model.float()
    assert id(model.decoder.blocks[0]) not in step._prepared
    assert [s["tokens"] for s in model.transcribe(clip)["segments"]] == before
    quantize_int8(model)
    from whisperkv.model.int8_step import Int8BlockStep, Int8StepRows

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


def test_the_batched_modes_windows_take_it_past_16_rows(tiny_model, two_windows_cross, monkeypatch):
    """Two windows of ten beams (20 rows, 10 a window: the batched mode's beam search) in one call per
    block, with the twin's bits: the attention kernel's 16-row limit is per window."""
    decoder = tiny_model.decoder
    calls = []
    call = BlockStep.__call__
    monkeypatch.setattr(BlockStep, "__call__", lambda self, *args: calls.append(1) or call(self, *args))
    fused = _decode(decoder, two_windows_cross, 20, steps=3)
    assert len(calls) == 3 * len(decoder.blocks)
    steps = [block.block_step for block in decoder.blocks]
    try:
        for block in decoder.blocks:
            block.block_step = None
        twin = _decode(decoder, two_windows_cross, 20, steps=3)
    finally:
        for block, step in zip(decoder.blocks, steps, strict=True):
            block.block_step = step
    assert torch.equal(fused[0], twin[0])
    assert all(torch.equal(a, b) for a, b in zip(fused[1], twin[1], strict=True))
