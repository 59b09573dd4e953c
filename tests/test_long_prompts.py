"""A float32 prompt of ``PROMPT_POSITIONS`` or more goes through PyTorch's linears (MKL's GEMMs), not the
step rows kernel (``CpuStepPlan.block``): its Self-KV is the plain PyTorch block's, bit for bit; a
shorter prompt and every step stay on the kernel; and a long-form transcript, whose windows are prompted
with the text before them, is the reference's (``test_parity.py``) and the row GEMMs' twin's."""

from __future__ import annotations

import pytest
import torch

from tests.block_step_twins import cross_kv_of
from whisperkv.cpu.plan import PROMPT_POSITIONS, use_attention_kernels
from whisperkv.cpu.step_rows import StepRowsKernel


@pytest.fixture
def block_calls(monkeypatch):
    """The rows of each call of the step rows kernel on a block's linear (not the vocabulary's)."""
    calls = []
    call = StepRowsKernel.__call__

    def counted(self, x, weight, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if weight.shape[0] < 50_000:
            calls.append(x.shape[0])
        return call(self, x, weight, *args, **kwargs)

    monkeypatch.setattr(StepRowsKernel, "__call__", counted)
    return calls


def _prompt_self_kv(decoder, cross, positions: int) -> list[torch.Tensor]:  # noqa: ANN001
    cache = decoder.new_cache(cross)
    tokens = torch.arange(1000, 1000 + positions)[None]
    with torch.no_grad():
        decoder(tokens, cache, positions=[positions - 1])
    return [torch.cat([kv.key, kv.value]) for kv in cache.self_kv]


def test_a_long_prompt_is_pytorchs_and_a_short_one_the_kernels(kernel_model, speech_dir, block_calls):
    decoder = kernel_model.decoder
    assert "long prompts pytorch" in kernel_model.weights_digest
    cross = cross_kv_of(kernel_model, speech_dir, ["en/jfk.flac"])
    long = _prompt_self_kv(decoder, cross, PROMPT_POSITIONS)
    assert block_calls == []
    plan = decoder.plan
    try:
        decoder.plan = None  # DecoderBlock.forward as it is without the CPU backend's plan
        assert all(torch.equal(a, b) for a, b in zip(long, _prompt_self_kv(decoder, cross, PROMPT_POSITIONS)))
    finally:
        decoder.plan = plan
    _prompt_self_kv(decoder, cross, PROMPT_POSITIONS - 1)
    assert block_calls == [PROMPT_POSITIONS - 1] * 6 * len(decoder.blocks)


def test_a_long_form_transcript_is_the_row_gemms(kernel_model, speech_dir, block_calls):
    """Windows after the first are prompted with the text before them (a long prompt): the tokens are
    the slow twin's, whose steps and prompts are the row GEMMs' and PyTorch's."""
    import whisperkv

    audio = whisperkv.load_audio(speech_dir / "long" / "lj001_0001-0032_concat.flac")[: 16000 * 70]
    decoder, prompts = kernel_model.decoder, []
    forward = decoder.forward
    decoder.forward = lambda tokens, *args, **kwargs: (
        prompts.append(tokens.shape[-1]) or forward(tokens, *args, **kwargs)
    )
    try:
        fast = kernel_model.transcribe(audio, temperature=0.0)
    finally:
        del decoder.forward
    assert max(prompts) >= PROMPT_POSITIONS  # at least one window prompted with the text before it
    assert all(rows < PROMPT_POSITIONS for rows in block_calls)  # (a step's calls are C's own)
    try:
        use_attention_kernels(kernel_model, rows=False)
        twin = kernel_model.transcribe(audio, temperature=0.0)
    finally:
        use_attention_kernels(kernel_model, rows=True)
    assert len({s["seek"] for s in fast["segments"]}) >= 3
    assert [s["tokens"] for s in fast["segments"]] == [s["tokens"] for s in twin["segments"]]
