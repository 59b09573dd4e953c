"""Symmetric int8 rows: one scale per row (its largest |value| / 127), values rounded to it in ±127.

One rule for every int8 table of the model: the int8 type's linears and embedding
(``cpu/quantize.py``).
"""

from __future__ import annotations

import torch


def row_scales(weight: torch.Tensor, block: int = 4096) -> torch.Tensor:
    """Each row's largest |value| / 127 (at least 1e-12), float32 [rows]: one symmetric int8 scale per row.

    Computed ``block`` rows at a time: ``weight.abs()`` of the whole vocabulary table was an 80 MB
    temporary (tiny.en), twice while loading, and set the int8 type's peak memory (516 MB at load
    against 439 MB after a transcription, measured)."""
    out = torch.empty(weight.shape[0], dtype=torch.float32)
    for start in range(0, weight.shape[0], block):
        out[start : start + block] = weight[start : start + block].abs().amax(dim=1).float() / 127.0
    return out.clamp_min(1e-12)


def quantize_rows(weight: torch.Tensor, scales: torch.Tensor, block: int = 4096) -> torch.Tensor:
    """``weight`` [rows, in] as int8 with one scale per row (``row_scales``): round(w / scale) in ±127.

    ``block`` rows at a time, so no float32 temporary of a whole vocabulary table is made."""
    qweight = torch.empty(weight.shape, dtype=torch.int8)
    for start in range(0, weight.shape[0], block):
        rows = slice(start, start + block)
        qweight[rows] = torch.round(weight[rows].float() / scales[rows, None]).clamp(-127, 127)
    return qweight


def quantized_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight``'s int8 rows and their scales: ``quantize_rows`` with ``row_scales``."""
    scales = row_scales(weight)
    return quantize_rows(weight, scales), scales


def row_sums(qweight: torch.Tensor, block: int = 4096) -> torch.Tensor:
    """Each int8 row's sum as int32 [rows] (the kernel's zero-point correction), ``block`` rows at a time:
    summing the whole table at once widened it to an int32 temporary (80 MB for tiny.en's vocabulary,
    the int8 load's peak)."""
    out = torch.empty(qweight.shape[0], dtype=torch.int32)
    for start in range(0, qweight.shape[0], block):
        out[start : start + block] = qweight[start : start + block].sum(dim=1, dtype=torch.int32)
    return out
