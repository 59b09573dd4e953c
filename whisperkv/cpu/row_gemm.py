"""One-position rows through the decoder's matrices as GEMMs of 2 or 3 rows: fast, and row-exact.

Since round 11 a float32 model with the kernels' library steps through ``cpu/step_rows.py`` instead
(each linear with its LayerNorm, bias, GELU and residual in one C call; row-exact by construction);
this module stays the path without a C compiler, the slow twin in the tests, and the layer every
decoder linear is (``RowGemmLinear``: prompts and the encoder-side shapes still go through it).

A decoder step multiplies a few rows (one per beam, per request) by every weight matrix of the decoder
and by the 51,864-token vocabulary table: a memory-bound product whose speed depends on how the BLAS
reads the matrix, and MKL reads it fastest one way on Intel's CPUs and the other on AMD's, so each chunk
of rows X is one GEMM in the orientation of this CPU's maker (``cpu_weight_first``, fixed per machine: never
chosen by a timing, so every process computes the same bits):
* ``X @ W.T`` (the row-major weight transposed) on Intel: on a 2-core Xeon with AMX (MKL 2024.2,
  float32, 2 threads, scratch) tiny.en's vocabulary table 1.8 ms for 2 rows against 4.2 ms as
  ``W @ X.T``; a 1536 x 384 linear 15 against 71 us; the utterances without a C compiler 4.8 s
  against 7.8 (the same text);
* ``W @ X.T`` (then transposed back, contiguous) elsewhere: on a 2-core AMD EPYC Zen 1 the vocabulary
  table 5.8 ms for 2 rows against 16.0 as ``X @ W.T`` (7.2 against 23.2 for 5 rows), the decoder's
  linears 0.9-1.3x as long for 2-3 rows, 0.6-0.8x for 5 (scratch; the whole run: RESULTS, session 70).

Batching must not change a row's numbers (a server's request gets the transcript it gets alone), and
MKL picks its kernel by the number of rows: one row is a GEMV, 2–3 rows give a row one set of bits,
4–10 another. So a step's rows are cut by ``plan_rows`` along the groups they belong to (a group: the
rows of one window's cache — 1 for greedy, 5 for beam 5):
* groups of 1–3 rows are packed together into chunks of exactly 2 or 3 rows (a lone row padded with
  a zero row): any row in any such chunk gets the same bits;
* a group of 4 or more rows (beams, best-of samples) is a chunk of its own of 4–10 rows: its rows
  travel together solo or batched, so their bits depend on nothing else either.
``RowWidths`` checks on each real matrix, once, that the widths of each class agree; where they do not,
the class falls back to chunks of 2. The result differs from ``x @ W.T`` of one row (a GEMV) only in
the order of the sums (about 1e-6 on logits; the parity tests check the tokens).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from whisperkv.cpu.flags import cpu_vendor

#: the two width classes: chunks of these widths give a row the same bits within a class (MKL, AVX-512)
SMALL = (3, 2)
LARGE = (4, 5, 6, 7, 8, 9, 10)  # every width group_widths can give
#: a group at least this large is a chunk (or chunks) of its own, of LARGE-class widths
GROUP_ALONE = 4
MAX_WIDTH = 10


def chunk_widths(n: int, widths: tuple[int, ...] = SMALL) -> list[int]:
    """Chunk sizes covering ``n`` packed rows: as many of 3 as fit, the rest in 2s (1 → [2], padded;
    4 → [2, 2]; 5 → [3, 2]; 7 → [3, 2, 2]); with ``widths == (2,)`` only 2s."""
    if widths == (2,):
        return [2] * ((n + 1) // 2)
    threes, rest = divmod(n, 3)
    if rest == 1 and threes:
        return [3] * (threes - 1) + [2, 2]
    return [3] * threes + ([2] if rest else [])


def group_widths(n: int) -> list[int]:
    """Balanced chunk sizes, each in [4, 10], for a group of ``n`` >= 4 rows (11 → [6, 5], 16 → [8, 8])."""
    parts = -(-n // MAX_WIDTH)
    base, extra = divmod(n, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def same_bits(weight: torch.Tensor, widths: tuple[int, ...], weight_first: bool = False) -> bool:
    """Whether a row gets the same bits from ``weight`` in a chunk of each width (one product each),
    multiplied as ``W @ X.T`` where ``weight_first``, else ``X @ W.T``."""
    if len(widths) < 2:
        return True
    row = torch.linspace(-1.0, 1.0, weight.shape[1], dtype=weight.dtype)
    firsts = []
    for width in widths:
        chunk = torch.stack([row, *[row.flip(0) * (i + 2) for i in range(width - 1)]])
        firsts.append(_chunk(weight, chunk, width, None, weight_first)[0])
    return all(torch.equal(firsts[0], f) for f in firsts[1:])


def cpu_weight_first() -> bool:
    """Whether this CPU's chunks are ``W @ X.T`` (AMD's, other makers') rather than ``X @ W.T`` (Intel's)."""
    return cpu_vendor() != "GenuineIntel"


class RowWidths:
    """Which chunk widths keep a row's bits for one matrix, measured on it once, and the orientation its
    chunks are multiplied in (``weight_first``; None: this CPU's)."""

    def __init__(self, weight: torch.Tensor, weight_first: bool | None = None) -> None:
        cpu = weight.device.type == "cpu"
        self.weight_first = cpu_weight_first() if weight_first is None else weight_first
        self.small = SMALL if not cpu or same_bits(weight, SMALL, self.weight_first) else (2,)
        self.large = not cpu or same_bits(weight, LARGE, self.weight_first)


def plan_rows(sizes: list[int], widths: RowWidths) -> tuple[tuple[int, int, int], ...]:
    """(start, stop, width) chunks covering rows grouped by ``sizes``: runs of small groups packed into
    SMALL-class chunks, each large group alone in LARGE-class chunks. ``width > stop - start`` pads."""
    return _plan(tuple(sizes), widths.small, widths.large)


@functools.lru_cache(maxsize=256)  # a step asks once per matrix (25 for tiny.en), with the same sizes
def _plan(sizes: tuple[int, ...], small: tuple[int, ...], large: bool) -> tuple[tuple[int, int, int], ...]:
    plan: list[tuple[int, int, int]] = []
    start = run = 0

    def pack(begin: int, n: int) -> None:
        for w in chunk_widths(n, small):
            plan.append((begin, min(begin + w, begin + n), w))
            begin, n = begin + w, n - w

    for size in sizes:
        if size >= GROUP_ALONE and large:
            if run:
                pack(start - run, run)
                run = 0
            for w in group_widths(size):
                plan.append((start, start + w, w))
                start += w
        else:
            run += size
            start += size
    if run:
        pack(start - run, run)
    return tuple(plan)


def rows_times(
    weight: torch.Tensor,
    rows: torch.Tensor,
    widths: RowWidths,
    sizes: list[int] | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``rows @ weight.T (+ bias)`` for rows [n, in] grouped by ``sizes`` (default: one group), chunk by
    chunk: a contiguous [n, out]. ``bias`` [out] is added inside the GEMM (``addmm``), one call per
    chunk."""
    n = rows.shape[0]
    plan = plan_rows(sizes if sizes is not None else [n], widths)
    first = widths.weight_first
    if len(plan) == 1:  # the common step: one window, or windows that fit one chunk
        return _chunk(weight, rows, plan[0][2], bias, first)[:n]
    out = rows.new_empty(n, weight.shape[0])
    for start, stop, width in plan:
        out[start:stop] = _chunk(weight, rows[start:stop], width, bias, first)[: stop - start]
    return out


def _chunk(
    weight: torch.Tensor, rows: torch.Tensor, width: int, bias: torch.Tensor | None, weight_first: bool
) -> torch.Tensor:
    """One GEMM of exactly ``width`` rows (zero rows pad a short chunk): [width, out], contiguous (an
    elementwise op after it, GELU, then runs one loop whatever the batch, so a row keeps its bits)."""
    if rows.shape[0] < width:
        rows = F.pad(rows, (0, 0, 0, width - rows.shape[0]))
    if weight_first:
        product = torch.mm(weight, rows.T) if bias is None else torch.addmm(bias[:, None], weight, rows.T)
        return product.T.contiguous()
    if bias is None:
        return torch.mm(rows, weight.T)
    return torch.addmm(bias, rows, weight.T)


def widened(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A float16-held weight (``cpu/step_rows.py`` holds a float32 model's step matrices so where every
    value is a float16) as the float32 matrix it stands for, for float32 inputs: exact, per call."""
    return weight.float() if weight.dtype == torch.float16 and x.dtype == torch.float32 else weight


def use_row_gemm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """One position per row (a decoder step), float32 on the CPU: the case this module is for."""
    return (
        x.dim() >= 2
        and x.shape[-2] == 1
        and x.dtype == weight.dtype == torch.float32
        and x.device.type == weight.device.type == "cpu"
    )


def _apply(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    widths: RowWidths,
    x: torch.Tensor,
    sizes: list[int] | None,
) -> torch.Tensor:
    weight = widened(weight, x)
    if not use_row_gemm(x, weight):
        return F.linear(x, weight, bias)
    return rows_times(weight, x.reshape(-1, x.shape[-1]), widths, sizes, bias).reshape(*x.shape[:-1], -1)


class RowGemmLinear(nn.Linear):
    """An ``nn.Linear`` (same parameters, same state-dict names) whose decoder steps use ``rows_times``.

    Inputs with more than one position per row (a prompt, the encoder output) go through ``F.linear``
    as before: there the GEMM is large and already reads the weight once. ``sizes`` groups the rows
    (``plan_rows``); without it all rows are one group, as in a lone window's step.
    """

    widths: RowWidths
    groups_rows = True  # takes ``sizes`` (see ``linear_rows``)

    @classmethod
    def adopt(cls, linear: nn.Linear) -> RowGemmLinear:
        """Turn ``linear`` into this class in place (no copy of its weight) and check its widths."""
        linear.__class__ = cls
        linear.widths = RowWidths(linear.weight)
        return linear  # type: ignore[return-value]

    def forward(self, x: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
        return _apply(self.weight, self.bias, self.widths, x, sizes)


class FusedRowGemm:
    """The fused query|key|value projection (``MultiHeadAttention.fuse_qkv``) with the same rule."""

    groups_rows = True
    rebuilds_after_move = True  # ``MultiHeadAttention._apply`` fuses it again after ``.to()``

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias
        self.widths = RowWidths(weight)

    def __call__(self, x: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
        return _apply(self.weight, self.bias, self.widths, x, sizes)


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
