"""The int8 type's step attention kernel (cpu/attend.py): SDPA's numbers to float rounding,
row-exact whatever else is in the call, refused outside its shapes, built once and cached."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch

from tests.conftest import kernel_variant, torch_threads
from whisperkv.cpu import build
from whisperkv.cpu.attend import AttendKernel, load_kernel
from whisperkv.cpu.dot_attention import DotEncoderAttention
from whisperkv.cpu.flags import (
    cpu_has_amx_bf16,
    cpu_has_avx2_fma_f16c,
    cpu_has_bfloat16_products,
    cpu_has_vector_rows,
)
from whisperkv.cpu.head_by_head import HeadByHeadAttention
from whisperkv.cpu.int16_attention import Int16EncoderAttention
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.cpu.tiled_attention import TiledEncoderAttention
from whisperkv.cpu.tiled_linear import TiledEncoderLinear
from whisperkv.metrics import normalize_text
from whisperkv.model.attention import attend

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler to build the kernel"
)

N_HEAD, WIDTH = 6, 384


@pytest.fixture(scope="module")
def kernel() -> AttendKernel:
    built = load_kernel()
    assert built is not None, "a C compiler is here, so the kernel must build"
    return built


def _cache(rows: int, positions: int, capacity: int | None = None, seed: int = 0) -> tuple:
    """Keys and values [rows, H, positions, 64]; with ``capacity`` a view into a larger buffer, as a
    Self-KV's read is."""
    g = torch.Generator().manual_seed(seed)
    size = capacity or positions
    key = torch.randn(rows, N_HEAD, size, WIDTH // N_HEAD, generator=g)
    value = torch.randn(rows, N_HEAD, size, WIDTH // N_HEAD, generator=g)
    return key[:, :, :positions], value[:, :, :positions]


@pytest.mark.parametrize(
    ("windows", "beams", "positions", "causal"),
    [(1, 1, 1500, False), (1, 5, 1500, False), (3, 5, 1500, False), (1, 1, 1, True), (5, 1, 37, True)],
)
def test_kernel_gives_sdpas_numbers(kernel, windows, beams, positions, causal):
    key, value = _cache(windows, positions, capacity=448 if causal else None)
    q = torch.randn(windows * beams, 1, WIDTH, generator=torch.Generator().manual_seed(1)) * 3
    offset = positions - 1 if causal else None
    assert kernel.accepts(q, key, value, offset)
    got, want = kernel(q, key, value), attend(q, key, value, offset)
    assert got.shape == want.shape == (windows * beams, 1, WIDTH)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("windows", "beams", "positions", "causal"), [(1, 1, 1500, False), (3, 5, 1500, False), (5, 1, 37, True)]
)
def test_bfloat16_caches_give_sdpas_numbers_over_the_same_keys(kernel, windows, beams, positions, causal):
    """Caches held in bfloat16 (the int8 type's): each key and value is widened exactly, so the kernel
    gives SDPA's numbers over those keys and values in float32, to float rounding."""
    key, value = (t.bfloat16() for t in _cache(windows, positions, capacity=448 if causal else None))
    q = torch.randn(windows * beams, 1, WIDTH, generator=torch.Generator().manual_seed(1)) * 3
    offset = positions - 1 if causal else None
    assert kernel.accepts(q, key, value, offset)
    got, want = kernel(q, key, value), attend(q, key.float(), value.float(), offset)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not kernel.accepts(q, key, value.float(), offset)  # keys and values in one dtype
    assert not kernel.accepts(q, key.half(), value.half(), offset)  # float16: not a dtype it reads


def test_a_windows_rows_do_not_depend_on_the_call(kernel):
    """A window's rows get the same bits alone, beside other windows, and with one thread or two."""
    key, value = _cache(3, 1500)
    q = torch.randn(15, 1, WIDTH, generator=torch.Generator().manual_seed(2))
    with torch_threads(2):
        together = kernel(q, key, value)
        alone = kernel(q[5:10].contiguous(), key[1:2], value[1:2])
    assert torch.equal(together[5:10], alone)
    with torch_threads(1):
        assert torch.equal(kernel(q, key, value), together)


def test_kernel_takes_a_strided_query(kernel):
    """Queries come out of the fused query|key|value projection as a strided view."""
    key, value = _cache(2, 300)
    fused = torch.randn(2, 1, 3 * WIDTH)
    q = fused[..., :WIDTH]
    assert not q.is_contiguous()
    assert torch.equal(kernel(q, key, value), kernel(q.contiguous(), key, value))


def test_kernel_refuses_what_it_does_not_compute(kernel):
    key, value = _cache(1, 100)
    q = torch.randn(1, 1, WIDTH)
    assert not kernel.accepts(torch.randn(1, 2, WIDTH), key, value, None)  # a prompt: two positions
    assert not kernel.accepts(q.double(), key.double(), value.double(), None)
    assert not kernel.accepts(q.bfloat16(), key.bfloat16(), value.bfloat16(), None)
    assert not kernel.accepts(torch.randn(1, 1, 256), *_cache(1, 100)[:1], value[..., :32], None)
    assert not kernel.accepts(torch.randn(17, 1, WIDTH), key, value, None)  # 17 rows over one window
    assert not kernel.accepts(torch.randn(5, 1, WIDTH), key, value, 99)  # a mask across rows
    assert not kernel.accepts(torch.randn(3, 1, WIDTH), *_cache(2, 100), None)  # 3 rows over 2 windows
    assert not kernel.accepts(q, *_cache(1, 1501), None)  # more positions than Whisper has


def test_build_is_kept_and_reused(tmp_path):
    first = build.load_library.__wrapped__(tmp_path)
    assert first is not None and first.path.parent == tmp_path
    built = first.path.stat().st_mtime_ns
    again = build.load_library.__wrapped__(tmp_path)
    assert again is not None and again.path == first.path and again.path.stat().st_mtime_ns == built
    assert [p.name for p in tmp_path.iterdir()] == [first.path.name]  # no leftover temporary build


def test_loading_the_kernels_leaves_the_processes_floats_alone():
    """Built with -ffast-math, the library once linked gcc's crtfastmath.o, whose start-up code flushed
    denormal floats to zero for the whole process that loaded it (the user's PyTorch and NumPy too). The
    link is now without it: a fresh process keeps its denormals after loading."""
    import subprocess
    import sys

    probe = (
        "import numpy, torch; from whisperkv.cpu import build\n"
        "assert build.load_library() is not None\n"  # the cached build every process loads
        "print(float(numpy.float32(1e-40) * numpy.float32(1)), (torch.tensor([1e-40]) * 1).item())"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [float(v) > 0 for v in done.stdout.split()] == [True, True], done.stdout


def test_a_wheel_carries_the_kernels_sources(tmp_path):
    """A non-editable install (a wheel) holds every C source and header the build compiles: without them
    the kernels are silently not built and every step runs PyTorch's slower path."""
    import subprocess
    import sys
    import zipfile
    from pathlib import Path

    root = Path(build.__file__).resolve().parents[2]
    source = tmp_path / "source"  # a clean copy: setuptools reuses a stale build/ folder in the checkout
    shutil.copytree(root / "whisperkv", source / "whisperkv", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w"]
    done = subprocess.run([*command, str(tmp_path), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("whisperkv-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for source in build.SOURCES + build.HEADERS:
        assert f"whisperkv/cpu/kernels/{source.name}" in names, source.name


def test_without_a_compiler_there_is_no_kernel(tmp_path, monkeypatch):
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    assert build.load_library.__wrapped__(tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_a_failed_build_warns_and_leaves_sdpa(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    with pytest.warns(UserWarning, match="kernels .* were not built"):
        assert build.load_library.__wrapped__(tmp_path) is None


def test_an_unwritable_cache_falls_back_to_the_temporary_directory(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("WHISPERKV_CACHE", str(blocked / "cache"))  # under a file: cannot be made
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    built = build.load_library.__wrapped__()
    assert built is not None and built.path.parent == tmp_path / "tmp" / f"whisperkv-{os.getuid()}"


def test_both_cpu_types_decoder_steps_use_it(tiny_model, int8_model, kernel):
    """float32 and int8 decoder steps attend through the kernel; the float32 encoder keeps SDPA, the int8
    type's bfloat16 encoder goes head by head, or in AMX's tiles where the CPU has them; its float32
    encoder (fbgemm's linears) in 16-bit integers where the library has AVX2, else SDPA."""
    for model in (tiny_model, int8_model):
        assert model.decoder.attention_kernel is kernel
        assert all(b.attn.kernel is kernel and b.cross_attn.kernel is kernel for b in model.decoder.blocks)
    assert tiny_model.decoder.kv_dtype is None  # float32 caches
    encoder_attention = int8_model.encoder.blocks[0].attn.kernel
    if int8_model.encoder_dtype == torch.bfloat16 and not cpu_has_amx_bf16():  # head by head
        assert isinstance(encoder_attention, HeadByHeadAttention)
    elif "encoder int8 rows" in int8_model.weights_digest and cpu_has_bfloat16_products():
        # int8 linears (VNNI, no AMX): the attention between them in bfloat16, through AVX512-BF16's dot
        # product where the library has it, else head by head
        if DotEncoderAttention.available(kernel.library):
            assert isinstance(encoder_attention, DotEncoderAttention)
        else:
            assert isinstance(encoder_attention, HeadByHeadAttention) and encoder_attention.from_float32
    elif int8_model.encoder_dtype == torch.bfloat16 and TiledEncoderAttention.available(kernel.library):
        assert isinstance(encoder_attention, TiledEncoderAttention)
    elif Int16EncoderAttention.available(kernel.library):
        assert int8_model.encoder_dtype == torch.float32 and not cpu_has_bfloat16_products()
        assert isinstance(encoder_attention, Int16EncoderAttention)
        assert "encoder int16 kernel" in int8_model.weights_digest
    else:
        assert encoder_attention is None
    assert all(b.attn.kernel is None for b in tiny_model.encoder.blocks)


def test_head_by_head_attention_is_sdpas_to_bfloat16_rounding():
    """The bfloat16 encoder's attention: SDPA's numbers (in float32, from the same bfloat16 inputs) to
    bfloat16's rounding of the scores and weights, each window's bits its own whatever the batch."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 1500, WIDTH, generator=g).bfloat16()
    k, v = (torch.randn(2, N_HEAD, 1500, WIDTH // N_HEAD, generator=g).bfloat16() for _ in range(2))
    attention = HeadByHeadAttention()
    assert attention.accepts(q, k, v, None)
    assert not attention.accepts(q.float(), k.float(), v.float(), None)  # float32: SDPA, exact twin
    # the int8 rows encoder's (float32 between its int8 linears): the same bfloat16 numbers, in float32
    widening = HeadByHeadAttention(from_float32=True)
    assert widening.accepts(q.float(), k.float(), v.float(), None)
    assert torch.equal(widening(q.float(), k.float(), v.float()), attention(q, k, v).float())
    assert not attention.accepts(q[:, :1], k, v, 0)  # a decoder step
    got = attention(q, k, v)
    want = attend(q.float(), k.float(), v.float())
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    assert (got.float() - want).abs().mean() < 2e-3
    assert (got.float() - want).abs().max() < 5e-2
    assert torch.equal(attention(q[1:], k[1:], v[1:]), got[1:])


def test_the_attention_in_use_is_part_of_the_weights_digest(int8_model, tiny_model):
    """An encoder output or a cache made with the type's own attention is never taken for one made with
    SDPA: the weights digest every provenance carries says which was used."""
    own = int8_model.weights_digest
    # "linears kernel": the int8 step's linears in C (``cpu/int8_step.py``), where the rows kernel builds,
    # and then its final LayerNorm too ("final norm kernel", ``TextDecoder._logits``)
    built = int8_model.decoder.blocks[0].step_rows is not None
    linears = ", linears kernel, final norm kernel" if built else ""
    decoder = f"+attention(decoder kernel, bfloat16 caches{linears}, encoder "
    names = ("head-by-head", "amx tiles, linears tiles, convolutions tiles", "amx tiles", "sdpa")
    names += ("amx tiles, linears int8 tiles, convolutions tiles",)  # AMX-INT8 too: cpu/int8_tiles.py
    names += ("int16 kernel",)  # AVX2 without native bfloat16: fbgemm's linears
    for attention in ("head-by-head bfloat16", "dot kernel"):  # VNNI, no AMX
        names += (f"{attention}, linears rows kernel, convolutions bfloat16",)
    assert any(own.endswith(f"{decoder}{name})") for name in names), own
    assert int8_model.decoder.kv_dtype == torch.bfloat16
    try:
        use_attention_kernels(int8_model, bfloat16_caches=False)
        assert f"+attention(decoder kernel{linears}, encoder" in int8_model.weights_digest
        assert int8_model.decoder.kv_dtype is None  # float32 caches, read by the same kernel
        use_attention_kernels(int8_model, on=False)
        assert int8_model.weights_digest != own
        assert int8_model.weights_digest.endswith("+attention(decoder sdpa, encoder sdpa)")
        assert int8_model.weights_digest.count("+attention(") == 1
        assert int8_model.decoder.kv_dtype is None  # SDPA was slower over bfloat16 caches
    finally:
        use_attention_kernels(int8_model)
    assert int8_model.weights_digest == own
    float32 = tiny_model.weights_digest
    # where it is the faster; a float32 prompt of 32 positions or more through PyTorch's linears
    rows = ", linears kernel, final norm kernel, long prompts pytorch" if cpu_has_vector_rows() else ""
    assert float32.endswith(f"+attention(decoder kernel{rows}, encoder sdpa)")
    assert float32.count("+attention(") == 1
    try:
        use_attention_kernels(tiny_model, rows=True)  # asked for: the linears kernel on any CPU
        assert tiny_model.weights_digest.endswith(
            "+attention(decoder kernel, linears kernel, final norm kernel, long prompts pytorch, "
            "encoder sdpa)"
        )
        use_attention_kernels(tiny_model, rows=False)  # the step's linears through the row GEMMs
        assert tiny_model.weights_digest.endswith("+attention(decoder kernel, encoder sdpa)")
        assert tiny_model.weights_digest.count("+attention(") == 1
        use_attention_kernels(tiny_model, on=False)  # SDPA: the reference's attention, the plain digest
        assert "+attention(" not in tiny_model.weights_digest
        assert float32.startswith(tiny_model.weights_digest)
        assert tiny_model.decoder.attention_kernel is None
    finally:
        use_attention_kernels(tiny_model)
    assert tiny_model.weights_digest == float32


def test_only_cpu_float32_and_int8_models_take_it(tiny_model):
    import whisperkv

    half = whisperkv.load_model("tiny.en", compute_type="float16")
    with pytest.raises(ValueError, match="float32 and int8 models on the CPU, not torch.float16"):
        use_attention_kernels(half)
    assert half.decoder.attention_kernel is None and "+attention(" not in half.weights_digest


@pytest.mark.parametrize(
    "clips",
    # the second clip in -m slow only: the default run holds the kernel's greedy transcript of it to
    # openai-whisper's (SDPA) already (test_parity), and -m slow its beam 5 one too
    [["en/jfk.flac"], pytest.param(["en/ls_1089-134686-0000.flac"], marks=pytest.mark.slow, id="ls")],
    ids=["jfk", "ls"],
)
def test_float32_tokens_with_the_kernel_are_sdpas(tiny_model, speech_dir, clips):
    """The slow twin of the float32 step's attention: SDPA, the reference's own. Greedy and beam 5 give
    the same tokens either way (their logits differ by the order of the kernel's sums)."""
    tokens: dict[str, list] = {}
    try:
        for mode in ("sdpa", "kernel"):
            use_attention_kernels(tiny_model, on=mode == "kernel")
            tokens[mode] = [
                [s["tokens"] for s in tiny_model.transcribe(str(speech_dir / c), beam_size=beam)["segments"]]
                for c in clips
                for beam in (None, 5)
            ]
    finally:
        use_attention_kernels(tiny_model)
    assert tokens["kernel"] == tokens["sdpa"]


def test_int8_transcripts_with_and_without_it_agree(int8_model, speech_dir):
    """The kernel changes sums' order, and bfloat16 caches the keys' last bits, not what is heard: int8
    words with SDPA, with the kernel over float32 caches and over bfloat16 ones (whose Cross-KV and Self-KV
    are then bfloat16, half the bytes). Int8 is the accepted approximation, so the words are compared, not
    the punctuation: on a Xeon with AMX, int8 jfk ends "country." with SDPA and "country" with the kernel
    (a near-tie at the last timestamp), the same words."""
    texts, kv_bytes = {}, {}
    clips = ["en/jfk.flac", "en/lj_LJ001-0002.flac", "en/lj_LJ001-0005.flac"]
    modes = {"sdpa": {"on": False}, "kernel": {"bfloat16_caches": False}, "bfloat16": {}}
    try:
        for mode, how in modes.items():
            use_attention_kernels(int8_model, **how)
            results = [int8_model.transcribe(str(speech_dir / c), language="en", verbose=None) for c in clips]
            texts[mode] = [normalize_text(r["text"]) for r in results]
            kv_bytes[mode] = results[0]["cache"]["cross_kv_bytes"]
    finally:
        use_attention_kernels(int8_model)
    assert texts["kernel"] == texts["sdpa"] == texts["bfloat16"]
    assert kv_bytes["sdpa"] == kv_bytes["kernel"] == 2 * kv_bytes["bfloat16"] == 4 * 2 * 1500 * WIDTH * 4


def test_the_int8_encoders_attention_follows_the_cpu_or_the_caller(int8_model, kernel):
    """Head by head without AMX, AMX's tiles with it (SDPA's bfloat16 path where the library has no tile
    path); each when asked, and the weights digest says which made the encoder's numbers."""
    if int8_model.encoder_dtype != torch.bfloat16:
        pytest.skip("no native bfloat16 here: the int8 encoder has int8 linears and SDPA")
    chosen = int8_model.encoder.blocks[0].attn.kernel
    tiles = cpu_has_amx_bf16() and TiledEncoderAttention.available(kernel.library)
    assert isinstance(chosen, HeadByHeadAttention) == (not cpu_has_amx_bf16())
    assert isinstance(chosen, TiledEncoderAttention) == tiles
    digest = int8_model.weights_digest
    ways = [
        ({"head_by_head": True}, HeadByHeadAttention, "head-by-head)"),
        ({"head_by_head": False, "tiles": False}, type(None), "encoder sdpa)"),
    ]
    if TiledEncoderAttention.available(kernel.library):
        ways.append(({"head_by_head": False, "linears": False}, TiledEncoderAttention, "encoder amx tiles)"))
    if TiledEncoderLinear.available(kernel.library):  # the linears too (``cpu/tiled_linear.py``)
        linears = "linears int8 tiles" if "encoder int8 tiles" in digest else "linears tiles"  # int8_tiles.py
        ending = f"encoder amx tiles, {linears}, convolutions tiles)"
        ways.append(({"head_by_head": False}, TiledEncoderAttention, ending))
    try:
        for options, kind, ending in ways:
            use_attention_kernels(int8_model, **options)
            assert all(type(b.attn.kernel) is kind for b in int8_model.encoder.blocks), options
            assert int8_model.weights_digest.endswith(ending), options
            linears = ending.endswith("convolutions tiles)")
            assert all((b.tiles is not None) == linears for b in int8_model.encoder.blocks), options
            assert (int8_model.encoder.front is not None) == linears, options
    finally:
        use_attention_kernels(int8_model)
    assert int8_model.weights_digest == digest


def _attend_build(tmp_path, name: str, flags: tuple[str, ...]) -> AttendKernel:
    """``kernels/attend.c`` alone, built with ``flags``."""
    path = tmp_path / f"attend_{name}.so"
    return AttendKernel(kernel_variant(path, flags, "attend.c"), path)


def test_the_register_loops_give_the_plain_loops_bits(kernel, tmp_path):
    """With AVX-512 the scores of 16 keys at a time and the weighted values of 4 rows at a time run in
    registers, with AVX2 the weighted values of one row at a time (``kernels/attend.c``); built with
    ``WKV_PLAIN_ATTEND`` (the same flags otherwise) the plain loops run alone: the same bits, float32 and
    bfloat16 caches, 1-16 rows, positions in whole blocks of 16, with a tail, and fewer than 16. The
    AVX2 build is checked too wherever this CPU runs it (an AVX-512 CPU as well)."""
    pairs = [(kernel, _attend_build(tmp_path, "plain", (*build.FLAGS, "-DWKV_PLAIN_ATTEND")))]
    if cpu_has_avx2_fma_f16c():
        avx2 = (*build.FLAGS, "-mno-avx512f")
        plain = _attend_build(tmp_path, "avx2_plain", (*avx2, "-DWKV_PLAIN_ATTEND"))
        pairs.append((_attend_build(tmp_path, "avx2", avx2), plain))
    for fast, twin in pairs:
        for dtype in (torch.float32, torch.bfloat16):
            for windows, beams, positions in ((1, 1, 1), (1, 5, 15), (2, 5, 1500), (1, 16, 449), (3, 3, 64)):
                key, value = _cache(windows, positions, seed=positions)
                key, value = key.to(dtype), value.to(dtype)
                g = torch.Generator().manual_seed(beams)
                q = torch.randn(windows * beams, 1, WIDTH, generator=g) * 4
                got, want = fast(q, key, value), twin(q, key, value)
                assert torch.equal(got, want), (dtype, windows, beams, positions)
