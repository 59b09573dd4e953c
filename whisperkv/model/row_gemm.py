"""One-position rows through the decoder's matrices as GEMMs of 2 or 3 columns: fast, and row-exact.

A decoder step multiplies a few rows (one per beam, per request) by every weight matrix of the decoder
and by the 51,864-token vocabulary table: a memory-bound product whose speed depends on how the BLAS
reads the matrix. Measured on this project's CPU (MKL, AVX-512), float32, 2 threads:

* ``x @ W.T`` for one row (what ``F.linear`` and openai-whisper do) is a GEMV that read tiny.en's
  vocabulary table in 7.8 ms and the decoder's 24 linears in 3.4 ms;
* ``W @ X.T`` with X of 2 rows is a GEMM that read them in 1.9 ms and 1.5 ms.

Batching must not change a row's numbers (a server's request gets the transcript it gets alone), and
MKL picks its kernel by the number of columns: 2–3 columns give a row one set of bits, 4–10 another.
So rows go through GEMMs of exactly 2 or 3 columns (one row padded with a zero row), whatever the batch,
and ``same_bits`` checks on each real matrix, once, that widths 2 and 3 agree; where they do not, every
chunk has 2 columns. The result differs from ``x @ W.T`` only in the order of the sums (about 1e-6 on
logits; the parity tests check the tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: chunk widths in order of preference; see ``chunk_widths``
WIDTHS = (3, 2)


def chunk_widths(n: int, widths: tuple[int, ...] = WIDTHS) -> list[int]:
    """Chunk sizes covering ``n`` rows: as many of 3 as fit, the rest in 2s (1 → [2], padded;
    4 → [2, 2]; 5 → [3, 2]; 7 → [3, 2, 2]); with ``widths == (2,)`` only 2s."""
    if widths == (2,):
        return [2] * ((n + 1) // 2)
    threes, rest = divmod(n, 3)
    if rest == 1 and threes:
        return [3] * (threes - 1) + [2, 2]
    return [3] * threes + ([2] if rest else [])


def same_bits(weight: torch.Tensor, widths: tuple[int, ...] = WIDTHS) -> bool:
    """Whether a row gets the same bits from ``weight`` in a chunk of each width (one product each)."""
    if len(widths) < 2:
        return True
    row = torch.linspace(-1.0, 1.0, weight.shape[1], dtype=weight.dtype)
    firsts = []
    for width in widths:
        chunk = torch.stack([row, *[row.flip(0) * (i + 2) for i in range(width - 1)]])
        firsts.append((weight @ chunk.T)[:, 0])
    return all(torch.equal(firsts[0], f) for f in firsts[1:])


def checked_widths(weight: torch.Tensor) -> tuple[int, ...]:
    """``WIDTHS`` where they give the same bits on ``weight`` here, else chunks of 2 only."""
    return WIDTHS if same_bits(weight) else (2,)


def rows_times(weight: torch.Tensor, rows: torch.Tensor, widths: tuple[int, ...]) -> torch.Tensor:
    """``rows @ weight.T`` for rows [n, in] as ``weight @ chunk.T`` over chunks of ``widths``: [n, out]."""
    n, d = rows.shape
    outs, start = [], 0
    for width in chunk_widths(n, widths):
        chunk = rows[start : start + width]
        if chunk.shape[0] < width:
            chunk = torch.cat([chunk, chunk.new_zeros(width - chunk.shape[0], d)])
        outs.append((weight @ chunk.T).T[: n - start])
        start += width
    # contiguous rows: elementwise ops after this (GELU) take another, differently rounded loop on a
    # transposed tensor, and a row's bits would then depend on the batch again
    return outs[0].contiguous() if len(outs) == 1 else torch.cat(outs)


def use_row_gemm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """One position per row (a decoder step), float32 on the CPU: the case this module is for."""
    return (
        x.dim() >= 2
        and x.shape[-2] == 1
        and x.dtype == weight.dtype == torch.float32
        and x.device.type == weight.device.type == "cpu"
    )


class RowGemmLinear(nn.Linear):
    """An ``nn.Linear`` (same parameters, same state-dict names) whose decoder steps use ``rows_times``.

    Inputs with more than one position per row (a prompt, the encoder output) go through ``F.linear``
    as before: there the GEMM is large and already reads the weight once.
    """

    widths: tuple[int, ...] = WIDTHS

    @classmethod
    def adopt(cls, linear: nn.Linear) -> RowGemmLinear:
        """Turn ``linear`` into this class in place (no copy of its weight) and check its widths."""
        linear.__class__ = cls
        linear.widths = checked_widths(linear.weight) if linear.weight.device.type == "cpu" else WIDTHS
        return linear  # type: ignore[return-value]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not use_row_gemm(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        out = rows_times(self.weight, x.reshape(-1, x.shape[-1]), self.widths)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], -1)


class FusedRowGemm:
    """The fused query|key|value projection (``MultiHeadAttention.fuse_qkv``) with the same rule."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        self.widths = checked_widths(weight) if weight.device.type == "cpu" else WIDTHS

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not use_row_gemm(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        out = rows_times(self.weight, x.reshape(-1, x.shape[-1]), self.widths)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], -1)


def adopt_row_gemm(decoder: nn.Module) -> None:
    """Every linear of the decoder's blocks, fused query/key/value included, takes decoder steps as
    ``rows_times`` GEMMs (float32 CPU models; ``load_model`` calls it)."""
    from whisperkv.model.attention import MultiHeadAttention

    for module in decoder.modules():
        if isinstance(module, MultiHeadAttention) and module.qkv is not None:
            module.fuse_qkv(FusedRowGemm)
    for module in list(decoder.modules()):
        if type(module) is nn.Linear:
            RowGemmLinear.adopt(module)
