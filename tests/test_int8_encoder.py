"""The int8 type's encoder where the CPU has AVX512-VNNI but no AMX (``cpu/int8_encoder.py``): int8
linears through the rows kernel, each with its LayerNorm, GELU and residual; bfloat16 convolutions and
attention. Held to its twin (the PyTorch block over the same int8 linears, the float32 front), to the
float32 encoder, and to float32's words on real speech."""

from __future__ import annotations

import pytest
import torch

import whisperkv
from whisperkv.audio import N_FRAMES, load_audio, log_mel_spectrogram, pad_or_trim
from whisperkv.cpu import flags
from whisperkv.cpu.int8_encoder import Bfloat16Front, Int8EncoderBlock
from whisperkv.cpu.int8_rows import load_rows_kernel
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.cpu.quantize import encoder_choice, quantize_int8
from whisperkv.metrics import normalize_text

from .conftest import SPEECH_DIR, english_clips

if load_rows_kernel() is None:
    pytest.skip(
        "no int8 rows kernel here (no compiler, or neither AVX512-VNNI nor AVX2)", allow_module_level=True
    )


@pytest.fixture(scope="module")
def rows_model():
    model = whisperkv.load_model("tiny.en")
    return quantize_int8(model, encoder="int8 rows")


@pytest.fixture(scope="module")
def jfk_mel():
    audio = load_audio(SPEECH_DIR / "en" / "jfk.flac")
    return pad_or_trim(log_mel_spectrogram(audio)[:, :N_FRAMES], N_FRAMES)[None]


def test_without_amx_the_int8_type_takes_the_rows_encoder(monkeypatch):
    kernel = load_rows_kernel()
    monkeypatch.setattr("whisperkv.cpu.quantize.cpu_has_amx_bf16", lambda: False)
    monkeypatch.setattr("whisperkv.cpu.quantize.cpu_has_avx512_vnni", lambda: True)
    assert encoder_choice(kernel) == "int8 rows"
    assert encoder_choice(None) in ("bfloat16", "int8")  # no rows kernel: never the rows encoder
    # AVX2 without VNNI: the kernel's 16-bit products suit a step's few rows, not a window's 1,500
    # (tiny.en, 2-core AMD EPYC Zen 3: 343 ms a window against fbgemm's 210)
    monkeypatch.setattr("whisperkv.cpu.quantize.cpu_has_avx512_vnni", lambda: False)
    monkeypatch.setattr("whisperkv.cpu.quantize.cpu_has_fast_bfloat16", lambda: False)
    assert encoder_choice(kernel) == "int8"
    monkeypatch.setattr("whisperkv.cpu.quantize.cpu_has_amx_bf16", lambda: True)
    monkeypatch.setattr("whisperkv.cpu.quantize.cpu_has_fast_bfloat16", lambda: True)
    monkeypatch.setattr("whisperkv.cpu.quantize.int8_tiles_available", lambda: False)
    assert encoder_choice(kernel) == "bfloat16"  # AMX's bfloat16 tiles (tests/test_tiled_linear.py)
    monkeypatch.setattr("whisperkv.cpu.quantize.int8_tiles_available", lambda: True)
    # AMX-INT8 too (tests/test_int8_tiles.py): small's width and up; tiny.en's and base's gain too little
    assert [encoder_choice(kernel, width) for width in (384, 512, 768, 1280)] == ["bfloat16"] * 2 + [
        "int8 tiles"
    ] * 2
    assert encoder_choice(kernel, 800) == "bfloat16"  # wide, but not whole steps of 64 inputs


def test_the_rows_encoder_is_planned_and_named(rows_model):
    encoder = rows_model.encoder
    assert all(isinstance(block.tiles, Int8EncoderBlock) for block in encoder.blocks)
    assert "encoder int8 rows" in rows_model.weights_digest
    assert "linears rows kernel" in rows_model.weights_digest
    if flags.cpu_has_bfloat16_products():
        assert isinstance(encoder.front, Bfloat16Front)
        assert "convolutions bfloat16" in rows_model.weights_digest
    with pytest.raises(ValueError, match="unknown or unavailable int8 encoder 'int4'"):
        quantize_int8(whisperkv.load_model("tiny.en"), encoder="int4")


def test_the_rows_encoder_is_its_twins_numbers_and_near_float32(rows_model, tiny_model, jfk_mel):
    with torch.no_grad():
        fast = rows_model.embed_audio(jfk_mel)
        exact = tiny_model.embed_audio(jfk_mel)
        use_attention_kernels(rows_model, linears=False)  # the twin: PyTorch's block, float32 front
        try:
            assert all(block.tiles is None for block in rows_model.encoder.blocks)
            assert rows_model.encoder.front is None
            twin = rows_model.embed_audio(jfk_mel)
        finally:
            use_attention_kernels(rows_model)
        again = rows_model.embed_audio(jfk_mel)
    assert torch.equal(again, fast)  # the same bits call after call
    # the same int8 products; LayerNorm, GELU and the convolutions' rounding differ in their last bits,
    # and move a position's next quantisation: measured on jfk, mean distances 3.0 % of float32's mean
    # magnitude between them, 4.0 % from each to float32 (the bfloat16 encoder's: 1.7 %)
    scale = exact.abs().mean()
    assert (fast - twin).abs().mean() < 0.05 * scale
    assert (fast - exact).abs().mean() < 0.06 * scale
    assert (twin - exact).abs().mean() < 0.06 * scale
    two = rows_model.embed_audio(torch.cat([jfk_mel, torch.zeros_like(jfk_mel)]))
    assert torch.equal(two[:1], fast)  # each position quantised on its own: a window is its own


def test_the_rows_encoder_hears_what_float32_hears(rows_model, tiny_model):
    if not flags.cpu_has_avx512_vnni():
        # the int8 type takes the rows encoder only with VNNI (``encoder_choice``); forced on an AVX2 CPU
        # (float32 convolutions, SDPA) it heard 25 of ls_1089's 28 words in place (Zen 3): not its setup
        pytest.skip("the rows encoder is the int8 type's choice only where AVX512-VNNI is")
    clips = english_clips()[:2]  # the whole set: benchmarks/int8_variants.py
    assert clips, "no English clips"
    for row in clips:
        audio = load_audio(SPEECH_DIR / row["file"])
        ours = normalize_text(whisperkv.transcribe(rows_model, audio, temperature=0.0)["text"]).split()
        exact = normalize_text(whisperkv.transcribe(tiny_model, audio, temperature=0.0)["text"]).split()
        same = sum(a == b for a, b in zip(ours, exact))
        assert same >= 0.9 * len(exact), (row["file"], ours, exact)
