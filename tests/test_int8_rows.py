"""The int8 type's decoder linears through the C kernel (cpu/int8_rows.py): float32's numbers to int8
rounding, as close as fbgemm's, each row's numbers its own whatever else is in the call."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.conftest import kernel_variant, torch_threads
from whisperkv.cpu import int8_rows
from whisperkv.cpu.build import FLAGS
from whisperkv.cpu.flags import cpu_has_avx2, cpu_has_avx512_vnni
from whisperkv.cpu.int8_linear import Int8Linear
from whisperkv.cpu.int8_rows import Int8RowsKernel, load_rows_kernel

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler to build the kernel"
)


@pytest.fixture(scope="module")
def kernel() -> Int8RowsKernel:
    if not (cpu_has_avx512_vnni() or cpu_has_avx2()):
        pytest.skip("neither AVX512-VNNI nor AVX2: the int8 type keeps fbgemm here")
    built = load_rows_kernel()
    assert built is not None, "a C compiler and AVX512-VNNI or AVX2 are here, so the kernel must build"
    return built


def _layer(out: int, width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # rows of very different sizes: per-row scales must follow each row's own magnitude
    weight = torch.randn(out, width, generator=g) * torch.logspace(-2, 0, out)[:, None]
    return weight, torch.randn(out, generator=g)


@pytest.mark.parametrize(
    ("out", "width", "rows"), [(1152, 384, 1), (384, 1536, 5), (37, 64, 16), (100, 8, 40)]
)
def test_kernel_is_float32_to_int8_rounding_and_as_close_as_fbgemm(kernel, out, width, rows):
    weight, bias = _layer(out, width)
    x = torch.randn(rows, 1, width, generator=torch.Generator().manual_seed(1))
    exact = torch.nn.functional.linear(x, weight, bias)
    ours, fbgemm = Int8Linear(weight, bias, kernel), Int8Linear(weight, bias)
    assert ours.kernel is kernel and fbgemm.kernel is None
    got = ours(x)
    assert got.shape == exact.shape == (rows, 1, out) and got.dtype == torch.float32
    # each output's error is bounded by its weight row's and its input row's quantisation steps
    step_w = weight.abs().amax(dim=1) / 127
    step_x = (x.amax(dim=-1, keepdim=True).clamp_min(0) - x.amin(dim=-1, keepdim=True).clamp_max(0)) / 255
    bound = width * (step_w * x.abs().amax(dim=-1, keepdim=True) + step_x * weight.abs().amax(dim=1))
    assert torch.all((got - exact).abs() <= bound)
    # no worse than fbgemm's, on the whole (each row has its own scale there, one for all in fbgemm)
    assert (got - exact).abs().mean() <= 1.1 * (fbgemm(x) - exact).abs().mean()


def test_a_rows_numbers_are_its_own(kernel):
    """A row gives the same bits alone, among 40 others (blocks of 16 rows), and with 1 thread or 2."""
    weight, bias = _layer(300, 384)
    layer = Int8Linear(weight, bias, kernel)
    x = torch.randn(40, 384, generator=torch.Generator().manual_seed(3)) * torch.logspace(-1, 1, 40)[:, None]
    with torch_threads(2):
        together = layer(x)
        for r in (0, 15, 16, 39):
            assert torch.equal(layer(x[r : r + 1]), together[r : r + 1])
    with torch_threads(1):
        alone = layer(x)
    assert torch.equal(alone, together)


def test_zero_rows_a_strided_input_and_no_bias(kernel):
    weight, _ = _layer(48, 96)
    layer = Int8Linear(weight, None, kernel)
    assert layer(torch.zeros(0, 96)).shape == (0, 48)
    wide = torch.randn(3, 200)
    assert torch.equal(layer(wide[:, 10:106]), layer(wide[:, 10:106].contiguous()))
    assert torch.equal(layer(torch.zeros(2, 96)), torch.zeros(2, 48))  # a zero row is exactly 0 + no bias


def test_widths_it_cannot_take_keep_fbgemm(kernel):
    weight, bias = _layer(16, 6)  # not a multiple of 4
    assert not kernel.takes(6) and Int8Linear(weight, bias, kernel).kernel is None
    with pytest.raises(ValueError, match="4..5120 wide in fours"):
        kernel.pack(torch.zeros(16, 6, dtype=torch.int8))


def test_without_avx512_vnni_or_avx2_fbgemm_is_kept(monkeypatch):
    """The plain C loops give the same bits but are slower than fbgemm there: no kernel is offered."""
    monkeypatch.setattr(int8_rows, "cpu_has_avx512_vnni", lambda: False)
    monkeypatch.setattr(int8_rows, "cpu_has_avx2", lambda: False)
    assert load_rows_kernel() is None


def test_the_int8_model_uses_it_and_names_it(kernel, int8_model):
    """Each row quantised on its own gives other numbers than fbgemm's one scale: the weights digest (every
    cache's provenance) says which."""
    decoder = int8_model.decoder
    assert decoder.logits_projection.kernel is not None
    assert all(
        block.mlp[0].kernel is not None and block.attn.qkv.kernel is not None for block in decoder.blocks
    )
    assert "decoder rows kernel" in int8_model.weights_digest


def _int8_rows_build(tmp_path, name: str, extra: tuple[str, ...]) -> Int8RowsKernel:
    """``kernels/int8_rows.c`` (with ``rows_f32.c``, whose GELU and LayerNorm it calls) built with the
    library's flags less OpenMP (one thread: the sums do not depend on it anyway), then ``extra``."""
    flags = tuple(f for f in FLAGS if f != "-fopenmp") + extra
    return Int8RowsKernel(kernel_variant(tmp_path / f"int8_{name}.so", flags, "int8_rows.c", "rows_f32.c"))


def test_the_plain_c_and_avx2_paths_give_the_librarys_numbers(kernel, tmp_path):
    """Without AVX512-VNNI the same packed layout runs through AVX2's 16-bit products
    (``kernels/int8_avx2.h``) or, without AVX2 too, plain C loops: the same integer sums, so the same
    bits. Both built here (AVX2 where this CPU runs it) and compared with the library in use."""
    plain = _int8_rows_build(tmp_path, "plain", ("-mno-avx2", "-mno-avx512f", "-mno-amx-int8"))
    builds = [plain]
    if cpu_has_avx2():  # AVX2 without AVX-512 (nor VNNI, nor AMX's tiles, which need VNNI's layout)
        avx2 = ("-mavx2", "-mno-avx512f", "-mno-amx-int8")
        builds.append(_int8_rows_build(tmp_path, "avx2", avx2))
        # the same with every call through the pairs: its widened path (8 rows or more) held to them too
        builds.append(_int8_rows_build(tmp_path, "avx2_pairs", (*avx2, "-DWIDE_MIN_ROWS=1000000")))
    # 1-10 rows: each group size the VNNI path splits a step's rows into (1-8 rows, several chains a
    # row) and the AVX2 path's pairs and odd last row; 8-10, 21, 47 and 93: the AVX2 path's widened
    # rows, 45 a pass in fives, with a last group of each size (1-4) and a second and third pass; 21 is
    # also a full VNNI block of 16, and 5. Widths of 24 and 25 dot-product steps (a split's tail);
    # outputs not a multiple of 16
    for width in (96, 100):
        weight, bias = _layer(100, width)
        fast_layer = Int8Linear(weight, bias, kernel)
        x = torch.randn(93, width, generator=torch.Generator().manual_seed(5)) * 3
        for slow in builds:
            slow_layer = Int8Linear(weight, bias, slow)
            assert torch.equal(fast_layer._packed, slow_layer._packed)
            for rows in (*range(1, 11), 21, 47, 93):
                assert torch.equal(fast_layer(x[:rows]), slow_layer(x[:rows])), (width, rows)
    # the largest sums the widest input can make: every input quantised to 255, every weight to +-127
    # (a row of ones, rows of +-1): 255 x 127 x 5120 = 165,811,200 each, exact in 32 bits, where
    # AVX2's byte product (vpmaddubsw) would saturate every pair at 32,767; 3 rows (pairs) and 9 (widened)
    width = int8_rows.MAX_IN
    weight = torch.ones(32, width) * torch.tensor([1.0, -1.0]).repeat(16)[:, None]
    for rows in (3, 9):
        ones = torch.ones(rows, width)
        for slow in builds:
            y = Int8Linear(weight, None, slow)(ones)
            assert torch.equal(y, Int8Linear(weight, None, kernel)(ones))
            # the scales' float rounding aside (255 x 1/255 x 127 x 1/127 is not exactly 1): a saturated
            # sum would be about half
            assert torch.allclose(y, torch.tensor([float(width), -float(width)]).repeat(rows, 16), rtol=1e-6)


def test_amx_products_are_the_vnni_products(kernel):
    """Where AMX builds and is permitted, calls of 2+ rows over widths in 64s take its tiles: the same
    integer sums as the VNNI path (``wkv_int8_rows_vnni``, which never takes them), so the same bits.
    Rows 1-70: one row (VNNI either way), partial and full 16-row tiles, one to three tile groups per
    pass and a second pass (49+); outputs not a multiple of 16; widths 64 (one tile step) to 1536."""
    import ctypes

    from whisperkv.cpu.attend import load_kernel

    if not kernel.amx:
        pytest.skip("no AMX here (or the system refuses its tiles): the VNNI path is the only one")
    twin = load_kernel().library.wkv_int8_rows_vnni
    twin.restype = ctypes.c_int
    twin.argtypes = [ctypes.c_void_p] + [ctypes.c_long] * 4 + [ctypes.c_void_p] * 5
    for out, width in ((37, 64), (1152, 384), (100, 1536)):
        weight, bias = _layer(out, width, seed=out)
        layer = Int8Linear(weight, bias, kernel)
        x = torch.randn(70, width, generator=torch.Generator().manual_seed(width)) * 3
        for rows in (1, 2, 5, 15, 16, 17, 33, 48, 49, 70):
            fast = layer(x[:rows])
            slow = torch.empty_like(fast)
            failed = twin(
                x.data_ptr(), width, rows, width, out, layer._packed.data_ptr(), layer._scales.data_ptr(),
                layer._row_sums.data_ptr(), layer._bias.data_ptr(), slow.data_ptr(),
            )  # fmt: skip
            assert failed == 0
            assert torch.equal(fast, slow), (out, width, rows)
