"""The int8 rows made a few rows at a time (``cpu/row_int8.py``): the whole-table formula's, bit for bit."""

from __future__ import annotations

import warnings

import pytest
import torch

from whisperkv.cpu.int8_linear import per_channel_qint8
from whisperkv.cpu.row_int8 import quantized_rows, row_blocks, row_scales, row_sums


def whole_table(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule in one expression over the whole table: scale = max |row| / 127, round(w / scale) in ±127."""
    scales = (weight.abs().amax(dim=1).float() / 127.0).clamp_min(1e-12)
    return torch.round(weight.float() / scales[:, None]).clamp(-127, 127).to(torch.int8), scales


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_quantized_rows_are_the_whole_table_rule(dtype):
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(3000, 700, generator=generator) * 3).to(dtype)
    weight[5] = 0  # an all-zero row: the smallest scale, zeros
    weight[7, 3] = -1000  # a row whose largest |value| is negative
    kept = weight.clone()
    read: list[tuple[int, int]] = []
    qweight, scales = quantized_rows(weight, lambda part: read.append((part.data_ptr(), part.shape[0])))
    want_q, want_scales = whole_table(weight)
    assert torch.equal(weight, kept)  # the input is read, never rounded in place
    assert qweight.dtype == torch.int8 and torch.equal(qweight, want_q)
    assert torch.equal(scales, want_scales) and torch.equal(row_scales(weight), want_scales)
    assert qweight[7, 3] == -127 and not qweight[5].any()
    # every row handed back once, in order, in blocks of about 2**20 values (three here)
    assert len(read) > 1 and sum(rows for _, rows in read) == weight.shape[0]
    assert [ptr for ptr, _ in read] == sorted(ptr for ptr, _ in read)
    assert torch.equal(row_sums(qweight), qweight.sum(dim=1, dtype=torch.int32))


def test_row_blocks_cover_every_row_once():
    weight = torch.empty(10, 3)
    spans = [(s.start, s.stop) for s in row_blocks(weight, elements=7)]
    assert spans == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    assert [(s.start, s.stop) for s in row_blocks(torch.empty(2, 50), elements=7)] == [(0, 1), (1, 2)]
    assert list(row_blocks(torch.empty(0, 5))) == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fbgemms_per_channel_rows_are_torchs_quantize_per_channel(dtype):
    """``per_channel_qint8`` (the fbgemm linears' weights, made a few rows at a time) against the call
    it stands for, on values at every rounding tie of their row's scale as well."""
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(2500, 640, generator=generator) * 0.05
    scales = row_scales(weight)
    weight[:, :255] = (torch.arange(-127, 128) + 0.5).clamp(max=126.5) * scales[:, None]  # halfway points
    weight[9] = 0
    weight = weight.to(dtype)
    scales = row_scales(weight)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantised tensor types announce their future move
        want = torch.quantize_per_channel(
            weight.float(), scales.double(), torch.zeros(len(scales), dtype=torch.long), 0, torch.qint8
        )
        got = per_channel_qint8(weight)
    assert got.dtype == torch.qint8 and got.q_per_channel_axis() == 0
    assert torch.equal(got.q_per_channel_scales(), want.q_per_channel_scales())
    assert not got.q_per_channel_zero_points().any()
    assert torch.equal(got.int_repr(), want.int_repr())
