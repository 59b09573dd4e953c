"""Weight loading: our CTranslate2 parser, the OpenAI .pt and transformers formats, and conversion."""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import whisperkv
from whisperkv.errors import ModelLoadError
from whisperkv.model.dims import KNOWN_DIMS
from whisperkv.weights import load_checkpoint
from whisperkv.weights.convert import convert
from whisperkv.weights.ctranslate2 import load_ctranslate2, read_model_bin


def test_tiny_en_dims_and_storage():
    ckpt = load_checkpoint("tiny.en")
    assert ckpt.dims == KNOWN_DIMS["tiny.en"]
    assert ckpt.format == "ctranslate2" and ckpt.stored_dtype == "float16"
    assert ckpt.alignment_heads == [(1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)]
    # fused Q|K|V rows were split back into three d x d projections
    assert ckpt.state_dict["encoder.blocks.0.attn.query.weight"].shape == (384, 384)
    assert "encoder.blocks.0.attn.key.bias" not in ckpt.state_dict
    assert ckpt.state_dict["decoder.token_embedding.weight"].shape == (51864, 384)


def test_every_known_size_has_consistent_dims():
    assert KNOWN_DIMS["large-v3"].n_mels == 128 and KNOWN_DIMS["large-v3"].num_languages == 100
    assert KNOWN_DIMS["large-v3-turbo"].n_text_layer == 4 and KNOWN_DIMS["large-v3-turbo"].n_audio_layer == 32
    assert KNOWN_DIMS["large-v2"].n_mels == 80 and KNOWN_DIMS["large-v2"].num_languages == 99
    for name, dims in KNOWN_DIMS.items():
        assert dims.is_multilingual == (not name.endswith(".en")), name
        assert dims.n_audio_state % dims.n_audio_head == 0


def test_base_model_from_two_package_halves(base_model):
    assert base_model.dims == KNOWN_DIMS["base"]
    assert base_model.is_multilingual and base_model.num_languages == 99


def _write_ct2(path, variables: dict[str, np.ndarray], spec: str = "WhisperSpec") -> None:
    """A minimal CTranslate2 model.bin writer (version 6) for synthetic test models."""
    codes = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.float16): 4}

    def string(s: str) -> bytes:
        raw = s.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw

    out = struct.pack("<I", 6) + string(spec) + struct.pack("<I", 1) + struct.pack("<I", len(variables))
    for name, arr in variables.items():
        out += string(name) + struct.pack("<B", arr.ndim) + struct.pack(f"<{arr.ndim}I", *arr.shape)
        out += struct.pack("<B", codes[arr.dtype]) + struct.pack("<I", arr.nbytes) + arr.tobytes()
    out += struct.pack("<I", 0)
    path.write_bytes(out)


def _synthetic_variables(quantize: bool) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A 1-layer, width-8 Whisper in CTranslate2 naming; returns (stored, expected float32)."""
    rng = np.random.default_rng(0)
    d, vocab, n_mels = 8, 51864, 4
    stored: dict[str, np.ndarray] = {}
    expected: dict[str, np.ndarray] = {}

    def put(name, shape, linear_weight=False):
        value = rng.standard_normal(shape).astype(np.float32)
        if name.endswith("attention/linear_0/bias") and "self_attention" in name:
            value[d : 2 * d] = 0  # key bias is zero in Whisper
        if name.endswith("attention/linear_1/bias") and "/attention/" in name and "self_" not in name:
            value[:d] = 0
        if quantize and linear_weight:
            scale = (127.0 / np.abs(value).max(axis=1)).astype(np.float32)
            q = np.round(value * scale[:, None]).astype(np.int8)
            stored[name], stored[name + "_scale"] = q, scale
            expected[name] = q.astype(np.float32) / scale[:, None]
        else:
            stored[name], expected[name] = (
                value.astype(np.float16),
                value.astype(np.float16).astype(np.float32),
            )

    put("encoder/conv1/weight", (d, n_mels, 3))
    put("encoder/conv1/bias", (d,))
    put("encoder/conv2/weight", (d, d, 3))
    put("encoder/conv2/bias", (d,))
    put("encoder/position_encodings/encodings", (1500, d))
    put("decoder/embeddings/weight", (vocab, d))
    put("decoder/position_encodings/encodings", (448, d))
    for side in ("encoder", "decoder"):
        stored[f"{side}/num_heads"] = np.array(2, dtype=np.int16)
        put(f"{side}/layer_norm/gamma", (d,))
        put(f"{side}/layer_norm/beta", (d,))
        p = f"{side}/layer_0"
        for ln in ("self_attention/layer_norm", "ffn/layer_norm"):
            put(f"{p}/{ln}/gamma", (d,))
            put(f"{p}/{ln}/beta", (d,))
        put(f"{p}/self_attention/linear_0/weight", (3 * d, d), True)
        put(f"{p}/self_attention/linear_0/bias", (3 * d,))
        put(f"{p}/self_attention/linear_1/weight", (d, d), True)
        put(f"{p}/self_attention/linear_1/bias", (d,))
        put(f"{p}/ffn/linear_0/weight", (4 * d, d), True)
        put(f"{p}/ffn/linear_0/bias", (4 * d,))
        put(f"{p}/ffn/linear_1/weight", (d, 4 * d), True)
        put(f"{p}/ffn/linear_1/bias", (d,))
    p = "decoder/layer_0/attention"
    put(f"{p}/layer_norm/gamma", (d,))
    put(f"{p}/layer_norm/beta", (d,))
    put(f"{p}/linear_0/weight", (d, d), True)
    put(f"{p}/linear_0/bias", (d,))
    put(f"{p}/linear_1/weight", (2 * d, d), True)
    put(f"{p}/linear_1/bias", (2 * d,))
    put(f"{p}/linear_2/weight", (d, d), True)
    put(f"{p}/linear_2/bias", (d,))
    return stored, expected


@pytest.mark.parametrize("quantize", [False, True], ids=["float16", "int8"])
def test_synthetic_ctranslate2_storage_is_decoded_exactly(tmp_path, quantize):
    stored, expected = _synthetic_variables(quantize)
    _write_ct2(tmp_path / "model.bin", stored)
    ckpt = load_ctranslate2(tmp_path)
    assert ckpt.stored_dtype == ("int8" if quantize else "float16")
    assert ckpt.dims.n_audio_state == 8 and ckpt.dims.n_mels == 4 and ckpt.dims.n_text_head == 2
    sd = ckpt.state_dict
    fused = expected["encoder/layer_0/self_attention/linear_0/weight"]
    torch.testing.assert_close(
        sd["encoder.blocks.0.attn.query.weight"], torch.from_numpy(fused[:8]), rtol=0, atol=0
    )
    torch.testing.assert_close(
        sd["encoder.blocks.0.attn.value.weight"], torch.from_numpy(fused[16:]), rtol=0, atol=0
    )
    kv = expected["decoder/layer_0/attention/linear_1/weight"]
    torch.testing.assert_close(
        sd["decoder.blocks.0.cross_attn.key.weight"], torch.from_numpy(kv[:8]), rtol=0, atol=0
    )
    mlp = expected["decoder/layer_0/ffn/linear_1/weight"]
    torch.testing.assert_close(sd["decoder.blocks.0.mlp.2.weight"], torch.from_numpy(mlp), rtol=0, atol=0)
    model = whisperkv.load.model_from_checkpoint(ckpt)
    assert model.embed_audio(torch.zeros(1, 4, 3000)).shape == (1, 1500, 8)


def test_bad_model_bin_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="truncated"):
        read_model_bin(struct.pack("<I", 6) + b"\x05\x00Whis", "x")
    stored, _ = _synthetic_variables(False)
    _write_ct2(tmp_path / "model.bin", {"a": np.zeros(1, np.float32)}, spec="TransformerSpec")
    with pytest.raises(ModelLoadError, match="not Whisper"):
        load_ctranslate2(tmp_path)
    with pytest.raises(ModelLoadError, match="unknown model"):
        load_checkpoint("no-such-model")
    (tmp_path / "junk").mkdir()
    with pytest.raises(ModelLoadError, match="not a Whisper model"):
        load_checkpoint(tmp_path / "junk")
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelLoadError, match="not a readable PyTorch checkpoint"):
        load_checkpoint(tmp_path / "bad.pt")


def test_convert_round_trips_every_format(tmp_path, tiny_model, speech_dir):
    pt = convert("tiny.en", tmp_path / "tiny.pt", "pt")
    hf = convert("tiny.en", tmp_path / "tiny-hf", "safetensors")
    umask = os.umask(0o022)
    os.umask(umask)
    # written like any other new file: the umask decides, not mkstemp's 0600 / mkdtemp's 0700
    assert stat.S_IMODE(pt.stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE(hf.stat().st_mode) == 0o777 & ~umask
    assert {stat.S_IMODE(f.stat().st_mode) for f in hf.iterdir()} == {0o666 & ~umask}
    assert json.loads((hf / "config.json").read_text())["d_model"] == 384
    assert (hf / "tokenizer.json").is_file()
    reference = tiny_model.state_dict()
    models = {
        "ctranslate2": tiny_model,
        "pt": whisperkv.load_model(str(pt)),
        "hf": whisperkv.load_model(str(hf)),
    }
    for name, model in models.items():
        sd = model.state_dict()
        assert sd.keys() == reference.keys(), name
        for key in sd:
            assert torch.equal(sd[key], reference[key]), f"{name}: {key}"
        assert model.alignment_heads == tiny_model.alignment_heads, name
    # identical weights must give identical greedy tokens, from every format
    audio = whisperkv.load_audio(speech_dir / "en" / "lj_LJ001-0008.flac")  # 1.8 s is enough
    tokens = {
        name: m.transcribe(audio, temperature=0.0)["segments"][0]["tokens"] for name, m in models.items()
    }
    assert tokens["pt"] == tokens["ctranslate2"] == tokens["hf"]


def test_convert_refuses_non_empty_destination(tmp_path):
    target = tmp_path / "busy"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty"):
        convert("tiny.en", target, "safetensors")
    assert (target / "keep.txt").read_text() == "mine"


def test_a_float16_pt_is_widened_one_tensor_at_a_time(tmp_path):
    """The .pt reader widens each stored tensor to float32 and lets it go at once (the load's peak is the
    float32 weights and one stored tensor), and gives exactly the stored values."""
    from whisperkv.model.dims import ModelDims
    from whisperkv.model.random_weights import random_checkpoint, write_random_model
    from whisperkv.weights import openai_pt
    from whisperkv.weights.mapped import MappedPages

    dims = ModelDims(80, 1500, 64, 2, 1, 51864, 448, 64, 2, 1)
    path = write_random_model(dims, tmp_path, seed=3)
    stored = torch.load(path, weights_only=True)["model_state_dict"]
    names = list(stored)
    assert all(t.dtype == torch.float16 for t in stored.values() if t.is_floating_point())
    want = {name: tensor.float() for name, tensor in stored.items()}
    widened = openai_pt._widened(stored, None)
    assert stored == {}  # every stored tensor handed over: nothing keeps the float16 copies alive
    assert list(widened) == names
    assert all(
        torch.equal(widened[name], want[name]) and widened[name].dtype == torch.float32 for name in names
    )
    # memory-mapped (how load_openai_pt reads a zip-format file): the same values, each one a copy
    # outside the map, so no tensor of the model is a view of the file once its pages are handed back
    mapped = torch.load(path, weights_only=True, mmap=True)["model_state_dict"]
    pages = MappedPages.of(mapped.values(), path)
    assert pages is not None and pages.end - pages.start >= sum(t.nbytes for t in want.values()) // 2
    from_map = openai_pt._widened(mapped, pages)
    assert all(torch.equal(from_map[name], want[name]) for name in names)
    assert not any(pages.start <= t.untyped_storage().data_ptr() < pages.end for t in from_map.values())
    loaded = openai_pt.load_openai_pt(path)
    assert loaded.stored_dtype == "float16"
    assert torch.equal(
        loaded.state_dict["decoder.token_embedding.weight"],
        random_checkpoint(dims, 3).state_dict["decoder.token_embedding.weight"],
    )


def test_only_a_files_own_private_map_is_handed_back(tmp_path):
    """``MappedPages`` advises the kernel to drop pages: it must never cover memory that is not the
    checkpoint file's own private map (ordinary tensors live in the heap). A legacy-format .pt cannot be
    mapped: it is read whole, with the same values."""
    from whisperkv.model.dims import ModelDims
    from whisperkv.model.random_weights import write_random_model
    from whisperkv.weights import openai_pt
    from whisperkv.weights.mapped import MappedPages

    dims = ModelDims(80, 1500, 64, 2, 1, 51864, 448, 64, 2, 1)
    path = write_random_model(dims, tmp_path, seed=5)
    assert MappedPages.of([torch.ones(1 << 16), torch.zeros(3)], path) is None  # heap memory
    mapped = torch.load(path, weights_only=True, mmap=True)["model_state_dict"]
    assert MappedPages.of(mapped.values(), tmp_path / "another.pt") is None  # not that file's map
    assert MappedPages.of(mapped.values(), path) is not None
    pages = MappedPages.of(mapped.values(), path)
    del mapped  # every tensor of the checkpoint gone: the map stays while its pages object does, so a
    assert any(line.endswith(str(path.resolve())) for line in _maps())  # drop never reaches reused memory
    pages.drop()
    del pages
    assert not any(line.endswith(str(path.resolve())) for line in _maps())
    legacy = tmp_path / "legacy.pt"
    torch.save(torch.load(path, weights_only=True), legacy, _use_new_zipfile_serialization=False)
    read_whole = openai_pt.load_openai_pt(legacy, widen=False)
    assert "mapped" not in read_whole.extra
    kept = openai_pt.load_openai_pt(path, widen=False)
    assert isinstance(kept.extra["mapped"], MappedPages)
    assert all(torch.equal(read_whole.state_dict[name], t) for name, t in kept.state_dict.items())


def _maps() -> list[str]:
    return Path("/proc/self/maps").read_text().splitlines()
