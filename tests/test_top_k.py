"""Beam search's top k (decoding/top_k.py, kernels/top_k.c): torch.topk's values and indices exactly,
ties, -inf, NaN and signed zeros included, from the library's build and from the kernel's AVX2 and
plain-C versions built here."""

from __future__ import annotations

import ctypes
import functools
import shutil
from pathlib import Path

import pytest
import torch

from whisperkv.cpu.build import SOURCES, compile_library
from whisperkv.decoding import top_k as top_k_module
from whisperkv.decoding.top_k import top_k

COMPILER = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C compiler to build the kernel")
SOURCE = next(s for s in SOURCES if s.name == "top_k.c")


@functools.cache
def _cases(count: int = 120) -> list[tuple[torch.Tensor, int]]:
    """Rows of every kind beam search could hand over, and some it would not."""
    g = torch.Generator().manual_seed(7)
    cases = []
    for trial in range(count):
        rows = int(torch.randint(1, 41, (1,), generator=g))
        n = int(torch.randint(1, 2500, (1,), generator=g))
        k = min(int(torch.randint(1, 12, (1,), generator=g)), n)
        x = torch.randn(rows, n, generator=g) * 3
        if trial % 3 == 0:
            x = (x * 2).round() / 2  # many equal values: ties inside and at the edge of the top k
        if trial % 4 == 0:
            x[:, ::3] = float("-inf")  # suppressed tokens
        if trial % 5 == 0:
            x[:, : n // 2] = float("-inf")  # most of a row suppressed
        if trial % 7 == 0:
            x[0, n // 2] = float("nan")
        if trial % 11 == 0:
            x = torch.minimum(x, torch.zeros(()))
            x[:, 0], x[:, -1] = -0.0, 0.0
        cases.append((x, k))
    # a log-softmax row of the real width, and a strided view of one
    wide = torch.log_softmax(torch.randn(40, 51_864, generator=g) * 3, dim=-1)
    cases += [(wide, 6), (wide[:, :51_000], 6), (torch.full((3, 100), float("-inf")), 6)]
    return cases


def _assert_same(got: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor, k: int) -> None:
    values, indices = x.topk(k, dim=-1)
    assert torch.equal(got[1], indices)
    assert torch.equal(got[0].nan_to_num(), values.nan_to_num())
    assert torch.equal(got[0].isnan(), values.isnan())


@pytest.mark.parametrize("case", range(123))
def test_top_k_is_torch_topk(case):
    x, k = _cases()[case]
    assert top_k_module._kernel_fn() is not None, "a compiler is here, so the kernel must be built"
    _assert_same(top_k(x, k), x, k)


def _rows_asked_of_torch_topk(monkeypatch) -> list[int]:  # noqa: ANN001 - pytest's fixture
    """Counts the rows of every ``torch.topk`` call from now on (``monkeypatch.undo()`` stops it)."""
    asked: list[int] = []
    original = torch.Tensor.topk

    def counting_topk(self, *args, **kwargs):  # noqa: ANN001, ANN202 - torch.Tensor.topk's signature
        asked.append(self.shape[0])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "topk", counting_topk)
    return asked


def test_tied_rows_go_through_torch_and_others_through_the_kernel(monkeypatch):
    """A row with equal values among its best gets torch.topk's own order; the kernel answers the rest."""
    x = torch.randn(6, 300, generator=torch.Generator().manual_seed(1))
    x[2, 10], x[2, 200] = 9.0, 9.0  # two equal best values
    x[4, 5:12] = 8.0  # seven equal: the top 3 and the edge
    asked = _rows_asked_of_torch_topk(monkeypatch)
    got = top_k(x, 3)
    assert asked == [2]  # rows 2 and 4 only, in one call
    monkeypatch.undo()
    _assert_same(got, x, 3)


def test_out_of_range_inputs_use_torch_topk():
    x = torch.randn(3, 100)
    for tensor, k in ((x.double(), 4), (x.T, 2), (x, 64), (x[0], 4)):
        values, indices = top_k(tensor, k)
        expected = tensor.topk(k, dim=-1)
        assert torch.equal(values, expected[0]) and torch.equal(indices, expected[1])


@pytest.mark.parametrize(
    "flags", [("-mavx2", "-mno-avx512f"), ("-mno-avx2", "-mno-avx512f")], ids=["avx2", "plain-c"]
)
def test_each_version_of_the_kernel_gives_the_same_answers(tmp_path: Path, flags):
    """The library is built with -march=native (AVX-512 here); the other two versions, built here."""
    built = compile_library(
        COMPILER, tmp_path / "top_k.so", ("-O3", "-ffast-math", "-fopenmp", "-fPIC", *flags), (SOURCE,)
    )
    fn = ctypes.CDLL(str(built)).wkv_top_k
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] + [ctypes.c_long] * 4 + [ctypes.c_void_p] * 3
    for x, k in _cases(40):
        values = torch.empty(x.shape[0], k)
        indices = torch.empty(x.shape[0], k, dtype=torch.long)
        tied = torch.empty(x.shape[0], dtype=torch.int32)
        pointers = (values.data_ptr(), indices.data_ptr(), tied.data_ptr())
        assert fn(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), k, *pointers) == 0
        expected = x.topk(k, dim=-1)
        untied = tied == 0
        assert torch.equal(indices[untied], expected[1][untied])
        assert torch.equal(values[untied].nan_to_num(), expected[0][untied].nan_to_num())
        # a row flagged tied has equal values among its k + 1 best (or fewer than k + 1 values)
        for row in tied.nonzero().flatten().tolist():
            best = x[row].topk(min(k + 1, x.shape[1])).values
            assert x.shape[1] <= k or bool((best[:-1] == best[1:]).any() or best.isnan().sum() > 1)


def test_without_the_kernel_every_row_goes_through_torch_topk(monkeypatch):
    """No compiler, no library: ``top_k`` is ``torch.topk`` itself (beam search unchanged)."""
    monkeypatch.setattr(top_k_module, "_kernel_fn", lambda: None)
    asked = _rows_asked_of_torch_topk(monkeypatch)
    x, k = _cases()[-3]  # the real width
    got = top_k(x, k)
    assert asked == [x.shape[0]]
    monkeypatch.undo()
    _assert_same(got, x, k)
