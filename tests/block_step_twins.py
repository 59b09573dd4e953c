"""What the block-step tests of both CPU types share (``test_block_step.py``, ``test_int8_step.py``): a
window's Cross-KV, a few greedy steps of one cache, and the check that a block's step in one C call
gives its twin's bits (the same kernels called one by one from Python)."""

from __future__ import annotations

import torch

import whisperkv
from whisperkv.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim

PROMPT = [50257, 50362, 440]


def cross_kv_of(model, speech_dir, clips: list[str]) -> list:  # noqa: ANN001
    """The Cross-KV of one window per clip (a batched step's cache when there are several)."""
    n_mels = model.dims.n_mels
    audio = [whisperkv.load_audio(speech_dir / c) for c in clips]
    mel = torch.stack([pad_or_trim(log_mel_spectrogram(a, n_mels), N_FRAMES) for a in audio])
    with torch.no_grad():
        return model.decoder.project_cross_kv(model.embed_audio(mel), model.encoder_provenance(mel))


def decode_steps(decoder, cross, rows: int, steps: int = 6):  # noqa: ANN001, ANN201
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


def assert_one_call_per_block_is_the_twin(
    decoder, cross, rows: int, steps: int, step_class, monkeypatch
) -> None:  # noqa: ANN001
    """Every step of every block through ``step_class`` (counted), then the same steps with no block step
    (the twin): the same logits and Self-KV, bit for bit."""
    assert all(isinstance(block.block_step, step_class) for block in decoder.blocks)
    calls = []
    call = step_class.__call__
    monkeypatch.setattr(step_class, "__call__", lambda self, *args: calls.append(1) or call(self, *args))
    monkeypatch.setattr(decoder, "decoder_step", None)  # the blocks' calls, not the whole step's one
    fused = decode_steps(decoder, cross, rows, steps)
    assert len(calls) == steps * len(decoder.blocks)
    kept = [block.block_step for block in decoder.blocks]
    try:
        for block in decoder.blocks:
            block.block_step = None  # the kernels called one by one from Python
        twin = decode_steps(decoder, cross, rows, steps)
    finally:
        for block, step in zip(decoder.blocks, kept, strict=True):
            block.block_step = step
    assert len(calls) == steps * len(decoder.blocks)
    assert torch.equal(fused[0], twin[0])
    assert all(torch.equal(a, b) for a, b in zip(fused[1], twin[1], strict=True))


def count_taken(monkeypatch, step_class) -> list[bool]:  # noqa: ANN001
    """Whether each call of ``step_class.logits`` (a whole step's fast path) computed the step, in call
    order (it returns None where it leaves the step to its twin)."""
    taken = []
    logits = step_class.logits

    def counted(self, *args):  # noqa: ANN001, ANN002, ANN202
        out = logits(self, *args)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(step_class, "logits", counted)
    return taken
