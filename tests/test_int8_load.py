"""The int8 and bfloat16 types load without the whole float32 model (issue 46's peak RSS), and are the
same models.

``load_model(compute_type="int8")`` keeps a float16 checkpoint's tensors float16 and lets
``quantize_int8`` widen and quantise them a block at a time. Its twin is what the load did before:
every tensor widened to float32, the float32 model built, then quantised. They must agree exactly:
every tensor of the state dict, the weights digest every cache's provenance starts from, and the tokens.
Checked on tiny.en as its CTranslate2 directory (float16 variables, kept float16 as read) and as a
float16 OpenAI ``.pt``, and for each of the int8 type's encoders (the CPU picks one; the others are
asked for); the bfloat16 type from the same two sources. The linears' packed weights, scales and row
sums are not in the state dict: they are compared as well.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import whisperkv
from whisperkv.audio import load_audio
from whisperkv.cpu.bf16_linear import Bfloat16Linear, load_bf16_rows_kernel
from whisperkv.cpu.bfloat16 import convert_bfloat16
from whisperkv.cpu.int8_linear import Int8Linear
from whisperkv.cpu.int8_tiles import Int8TileLinear, int8_tiles_available
from whisperkv.cpu.quantize import quantize_int8
from whisperkv.cpu.vocab import DEFAULT_LAYOUT
from whisperkv.load import model_from_checkpoint
from whisperkv.weights import load_checkpoint
from whisperkv.weights.openai_pt import save_openai_pt


@pytest.fixture(scope="module")
def float16_pt(tmp_path_factory):
    path = tmp_path_factory.mktemp("int8_load") / "tiny_en_float16.pt"
    save_openai_pt(load_checkpoint("tiny.en"), path, dtype=torch.float16)
    return path


def widened_then_quantised(source, **options) -> whisperkv.Whisper:
    """The twin: the float32 model first (as ``load_model`` built it for float32), then quantised."""
    model = model_from_checkpoint(load_checkpoint(source), vocab_layout=DEFAULT_LAYOUT)
    return quantize_int8(model, **options)


def mapped_from(path: Path) -> list[str]:
    """The lines of /proc/self/maps that map ``path`` into this process."""
    target = str(Path(path).resolve())
    return [line for line in Path("/proc/self/maps").read_text().splitlines() if line.endswith(" " + target)]


def assert_same_model(got, want) -> None:
    assert got.weights_digest == want.weights_digest
    got_state, want_state = got.state_dict(), want.state_dict()
    assert list(got_state) == list(want_state)
    for name, tensor in want_state.items():
        assert got_state[name].dtype == tensor.dtype, name
        assert torch.equal(got_state[name], tensor), name
    kinds = (Int8Linear, Bfloat16Linear, Int8TileLinear)
    got_linears = {name: m for name, m in got.named_modules() if isinstance(m, kinds)}
    want_linears = {name: m for name, m in want.named_modules() if isinstance(m, kinds)}
    assert list(got_linears) == list(want_linears) and got_linears
    for name, linear in want_linears.items():
        for field, value in vars(linear).items():  # the kernel's rows, or fbgemm's packed parameters
            other = vars(got_linears[name])[field]
            if isinstance(value, torch.Tensor):
                assert other.dtype == value.dtype and torch.equal(other, value), (name, field)
            elif field == "_packed" and value is not None:  # fbgemm's: compared unpacked
                (w, b), (w2, b2) = (torch.ops.quantized.linear_unpack(p) for p in (value, other))
                assert torch.equal(w.int_repr(), w2.int_repr()) and torch.equal(
                    w.q_per_channel_scales(), w2.q_per_channel_scales()
                )
                assert (b is None) == (b2 is None) and (b is None or torch.equal(b, b2)), name


@pytest.mark.parametrize("source", ["tiny.en", "float16 .pt"])
def test_int8_load_is_the_quantised_float32_model(source, float16_pt, speech_dir):
    jfk = load_audio(speech_dir / "en" / "jfk.flac")
    path = float16_pt if source == "float16 .pt" else source
    loaded = whisperkv.load_model(str(path), compute_type="int8")
    if source == "float16 .pt":  # read through a map, and no tensor the model keeps is a view of it:
        assert not mapped_from(path)  # once the load returns, the file is no longer mapped at all
    twin = widened_then_quantised(path)
    assert_same_model(loaded, twin)
    got, want = (m.transcribe(jfk, temperature=0.0) for m in (loaded, twin))
    assert [s["tokens"] for s in got["segments"]] == [s["tokens"] for s in want["segments"]]


@pytest.mark.parametrize("source", ["tiny.en", "float16 .pt"])
def test_bfloat16_load_is_the_converted_float32_model(source, float16_pt, speech_dir):
    """The bfloat16 type is made the same way, a block at a time from the stored float16 tensors (float16
    rounds to bfloat16 as its float32 widening does): the model converted from the float32 one."""
    jfk = load_audio(speech_dir / "en" / "jfk.flac")
    path = float16_pt if source == "float16 .pt" else source
    loaded = whisperkv.load_model(str(path), compute_type="bfloat16")
    if source == "float16 .pt":
        assert not mapped_from(path)
    twin = convert_bfloat16(model_from_checkpoint(load_checkpoint(path), vocab_layout=DEFAULT_LAYOUT))
    assert loaded.compute_type == twin.compute_type == "bfloat16"
    assert_same_model(loaded, twin)
    # without the kernel the model is PyTorch modules whose every tensor was compared above, so the same
    # tokens follow (and a bfloat16 window takes ~10 s on such a CPU); with it, the kernel's prepared
    # rows are not in the state dict, so the tokens are compared as well
    if load_bf16_rows_kernel() is None:
        return
    got, want = (m.transcribe(jfk, temperature=0.0) for m in (loaded, twin))
    assert [s["tokens"] for s in got["segments"]] == [s["tokens"] for s in want["segments"]]


def test_the_float16_checkpoint_is_kept_until_its_block_is_quantised(float16_pt):
    ckpt = load_checkpoint(float16_pt, widen=False)
    assert {t.dtype for t in ckpt.state_dict.values()} == {torch.float16}
    pages = ckpt.extra["mapped"]  # memory-mapped: the int8 load hands the pages back as it converts
    assert all(pages.start <= t.data_ptr() < pages.end for t in ckpt.state_dict.values())
    widened = load_checkpoint(float16_pt)
    assert {t.dtype for t in widened.state_dict.values()} == {torch.float32}
    model = model_from_checkpoint(ckpt, dtype=None)
    assert model.dtype == torch.float16 and model.encoder.blocks[0].mlp[0].weight.dtype == torch.float16


@pytest.mark.parametrize("encoder", ["bfloat16", "int8", "int8 tiles"])
def test_every_int8_encoder_gives_the_same_model_from_float16(encoder, float16_pt):
    """Every encoder the int8 type has, whichever this CPU picks for tiny.en (bfloat16 with AMX, the int8
    tiles' from small's width up with AMX-INT8, fbgemm's int8 or the rows kernel's elsewhere)."""
    if encoder == "int8 tiles" and not int8_tiles_available():
        pytest.skip("no AMX int8 tiles here")
    held = model_from_checkpoint(load_checkpoint(float16_pt, widen=False), dtype=None)
    twin = widened_then_quantised(float16_pt, encoder=encoder)
    assert_same_model(quantize_int8(held, encoder=encoder), twin)


def test_a_model_of_another_dtype_is_refused():
    model = model_from_checkpoint(load_checkpoint("tiny.en"), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="float32 model"):
        quantize_int8(model)


@pytest.mark.parametrize("kernel", ["rows kernel", "fbgemm"])
def test_query_key_value_are_thirds_of_the_fused_int8_layer(kernel):
    """The int8 type keeps one copy of a self-attention's query|key|value rows (the fused layer); the
    three layers are its thirds and give what separate int8 layers of the same weights give, bit for
    bit (each output is its own row's products and scale; the key's zero bias adds nothing)."""
    from whisperkv.cpu.int8_linear import Int8FusedPart
    from whisperkv.cpu.int8_rows import load_rows_kernel

    rows = load_rows_kernel() if kernel == "rows kernel" else None
    if kernel == "rows kernel" and rows is None:
        pytest.skip("the int8 rows kernel does not build here")
    generator = torch.Generator().manual_seed(7)
    d = 384
    weights = [torch.randn(d, d, generator=generator) / d**0.5 for _ in range(3)]
    biases = [torch.randn(d, generator=generator), None, torch.randn(d, generator=generator)]
    fused = Int8Linear(torch.cat(weights), torch.cat([biases[0], torch.zeros(d), biases[2]]), rows)
    x = torch.randn(2, 9, d, generator=generator)
    for part in range(3):
        separate = Int8Linear(weights[part], biases[part], rows)
        assert torch.equal(Int8FusedPart(fused, part)(x), separate(x)), part


def test_the_int8_model_holds_no_second_copy_of_query_key_value():
    from whisperkv.cpu.int8_linear import Int8FusedPart

    model = whisperkv.load_model("tiny.en", compute_type="int8")
    # an int8 tiles encoder's query|key|value is one int8 layer, its thirds the three layers; with AMX
    # tiny.en's encoder is bfloat16 in the tiles (``quantize.py``): no int8 layer in it
    int8_encoder = model.encoder_dtype != torch.bfloat16 or "encoder int8 tiles" in model.weights_digest
    for block in [*(model.encoder.blocks if int8_encoder else []), *model.decoder.blocks]:
        attn = block.attn
        assert all(isinstance(layer, Int8FusedPart) for layer in (attn.query, attn.key, attn.value))
        assert attn.query.fused is attn.qkv and attn.value.part == 2
    assert all(isinstance(block.cross_attn.query, Int8Linear) for block in model.decoder.blocks)  # unfused
