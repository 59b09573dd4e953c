"""A lone cache's float32 step through the row GEMMs in one Python function (``cpu/gemm_step.py``, the path
without the step kernels, as where no C compiler works): the same logits and Self-KV, bit for bit, as its
twin ``TextDecoder.forward_rows`` block by block, for greedy, several rows, beams and a group cut into
two chunks; the same transcript; and the steps it does not take are left to the twin untouched."""

from __future__ import annotations

import pytest
import torch

import whisperkv
from tests.block_step_twins import PROMPT, count_taken, cross_kv_of, decode_steps
from whisperkv.cpu.gemm_step import RowGemmStep
from whisperkv.cpu.plan import use_attention_kernels


@pytest.fixture(scope="module", params=["sdpa", "attention kernel"])
def gemm_model(request):
    """tiny.en stepping through the row GEMMs: with SDPA everywhere (what runs without a C compiler),
    and with the attention kernel where it builds (the step kernels' slow twin, ``rows=False``)."""
    model = whisperkv.load_model("tiny.en")
    use_attention_kernels(model, on=request.param != "sdpa", rows=False)
    if request.param != "sdpa" and model.decoder.attention_kernel is None:
        pytest.skip("no C compiler: the attention kernel is not built")
    assert model.decoder.blocks[0].step_rows is None
    return model


@pytest.fixture
def taken(monkeypatch):
    """Whether each call of ``RowGemmStep.logits`` computed the step (None: left to the twin)."""
    return count_taken(monkeypatch, RowGemmStep)


@pytest.mark.parametrize("rows", [1, 3, 5, 12])  # 12: one group cut into two chunks of six
def test_one_function_gives_the_twins_bits(gemm_model, speech_dir, monkeypatch, taken, rows):
    decoder = gemm_model.decoder
    assert type(decoder.decoder_step) is RowGemmStep
    cross = cross_kv_of(gemm_model, speech_dir, ["en/jfk.flac"])
    fused = decode_steps(decoder, cross, rows, steps=6)
    assert taken == [True] * 6
    with monkeypatch.context() as patch:
        patch.setattr(decoder, "decoder_step", None)  # forward_rows: block by block, module by module
        twin = decode_steps(decoder, cross, rows, steps=6)
    assert taken == [True] * 6  # the twin did not call it
    assert torch.equal(fused[0], twin[0])
    assert all(torch.equal(a, b) for a, b in zip(fused[1], twin[1], strict=True))


def test_the_same_transcript_as_the_twin(gemm_model, speech_dir, monkeypatch, taken):
    audio = whisperkv.load_audio(speech_dir / "en" / "jfk.flac")
    fused = gemm_model.transcribe(audio, temperature=0.0)
    assert taken and all(taken)
    with monkeypatch.context() as patch:
        patch.setattr(gemm_model.decoder, "decoder_step", None)
        twin = gemm_model.transcribe(audio, temperature=0.0)
    assert [s["tokens"] for s in fused["segments"]] == [s["tokens"] for s in twin["segments"]]
    assert "ask not what your country can do for you" in fused["text"]


def test_what_it_does_not_take_is_left_unchanged(gemm_model, int8_model, speech_dir):
    """A prompt of several positions, or a decoder whose linears are not float32 row GEMMs (the int8
    type's): None, and the cache holds what it held."""
    step = RowGemmStep()
    for model, tokens in ((gemm_model, torch.tensor([[1002, 1003]])), (int8_model, torch.tensor([[1002]]))):
        cache = model.decoder.new_cache(cross_kv_of(model, speech_dir, ["en/jfk.flac"]))
        with torch.no_grad():
            model.decoder(torch.tensor([PROMPT]), cache)
            assert step.logits(model.decoder, tokens, cache) is None
        assert cache.offset == len(PROMPT) and all(kv.length == len(PROMPT) for kv in cache.self_kv)
