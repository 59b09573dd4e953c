"""Symmetric int8 rows: one scale per row (its largest |value| / 127), values rounded to it in ±127.

One rule for every int8 table of the model: the int8 type's linears and embedding
(``cpu/quantize.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

#: values of a weight widened at once (4 MB as float32): a conversion's temporaries stay this small
BLOCK_ELEMENTS = 1 << 20


def row_blocks(weight: torch.Tensor, elements: int = BLOCK_ELEMENTS) -> Iterator[slice]:
    """Slices of ``weight``'s rows holding about ``elements`` values each (at least one row)."""
    step = max(1, elements // max(math.prod(weight.shape[1:]), 1))
    for start in range(0, weight.shape[0], step):
        yield slice(start, start + step)


def row_scales(weight: torch.Tensor) -> torch.Tensor:
    """Each row's largest |value| / 127 (at least 1e-12), float32 [rows]: one symmetric int8 scale per row.

    A few rows at a time (``row_blocks``): ``weight.abs()`` of the whole vocabulary table was an 80 MB
    temporary (tiny.en), twice while loading, and set the int8 type's peak memory (516 MB at load
    against 439 MB after a transcription, measured)."""
    out = torch.empty(weight.shape[0], dtype=torch.float32)
    for rows in row_blocks(weight):
        out[rows] = _block_scales(weight[rows])
    return out


def quantized_rows(
    weight: torch.Tensor, after_block: Callable[[torch.Tensor], None] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [rows, in] as int8 with one scale per row (``row_scales``): round(w / scale) in ±127,
    and the scales.

    One pass, a few rows at a time, each block widened once into one float32 temporary and rounded in
    place, so the load's peak holds little more than the result: with two passes over the table (the
    scales, then the values, three float32 temporaries of 4,096 rows each) and its float16 pages held to
    the end, quantising large-v3-turbo's vocabulary took the load 310 MB over the model before it.
    ``after_block`` is called with each block of ``weight`` once read (a memory-mapped checkpoint's pages
    handed back as it goes)."""
    qweight = torch.empty(weight.shape, dtype=torch.int8)
    scales = torch.empty(weight.shape[0], dtype=torch.float32)
    for rows in row_blocks(weight):
        block = weight[rows].to(torch.float32, copy=True)
        scales[rows] = scale = _block_scales(block)
        qweight[rows] = block.div_(scale[:, None]).round_().clamp_(-127, 127)
        if after_block is not None:
            after_block(weight[rows])
    return qweight, scales


def _block_scales(block: torch.Tensor) -> torch.Tensor:
    """The rows' largest |value| / 127, at least 1e-12 (max and -min: no |block| temporary)."""
    largest = torch.maximum(block.amax(dim=1), block.amin(dim=1).neg())
    return (largest.float() / 127.0).clamp_min(1e-12)


def row_sums(qweight: torch.Tensor) -> torch.Tensor:
    """Each int8 row's sum as int32 [rows] (the kernel's zero-point correction), a few rows at a time:
    summing the whole table at once widened it to an int32 temporary (80 MB for tiny.en's vocabulary,
    the int8 load's peak)."""
    out = torch.empty(qweight.shape[0], dtype=torch.int32)
    for rows in row_blocks(qweight):
        out[rows] = qweight[rows].sum(dim=1, dtype=torch.int32)
    return out
