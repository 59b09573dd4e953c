"""The tied vocabulary projection, logits = x · Eᵀ, laid out the way this machine reads fastest.

For a one-token decoder step of tiny.en this 1×384 by 384×51,864 product reads 80 MB and was the largest
single cost of the step. The same bytes are read at very different speeds depending on how they are
stored and which BLAS routine reads them (the performance issue measured 5.4 ms through MKL's GEMV on
the row-major table, 2.6 ms on a column-major copy, 1.5 ms through NumPy's OpenBLAS on one AMD EPYC;
another EPYC ranked them otherwise). ``load_model(vocab_layout="measure")`` times them on tables of the real
shape and keeps the fastest; the default is ``rows-gemm`` (fastest here for one row and for several,
and the only one whose rows keep their bits in any batch), fixed so that every process computes the
same bits:

* ``rows``        — E row-major [V, d], ``x @ E.T`` in PyTorch: exactly what openai-whisper computes;
* ``rows-gemm``   — E row-major, read by ``ChunkedRowProjection``: on a float32 model with the kernels'
  library, through the step's linears kernel (``cpu/step_rows.py``: each logit one fixed-order dot
  product; a beam-5 window's 5 rows 2.7 against MKL's 6.5 ms for tiny.en's table, one row 2.5
  against 2.4, in a replayed step (scratch)); otherwise
  GEMMs of X cut into chunks of 2–3 rows, or of one beam group's 4–10 rows (``cpu/row_gemm.py``), each
  ``X @ E.T`` on Intel and ``E @ X.T`` elsewhere, the way MKL reads the table at memory speed there
  (2 rows 1.8 ms against 4.2 on a Xeon with AMX; 5.8 against 16.0 on an AMD EPYC Zen 1), and a row's bits
  never depend on rows of other windows — so a row batched with other requests' rows equals its solo run
  (checked when the projection is built);
* ``columns``     — E stored column-major (the same values as a [V, d] view of a [d, V] buffer), so
  ``x @ E.T`` reads a contiguous [d, V] matrix;
* ``rows-numpy``  — E row-major, one-row products through NumPy (``E @ x``, OpenBLAS GEMV).

The three sum the same 384 products in different orders: logits differ by about 1e-6 (bounded and
measured by the tests, which also check the greedy tokens stay identical on real speech). Only one copy
of the table is ever kept: the embedding lookup reads the same storage, whatever its layout.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import torch
from torch import nn

from whisperkv.cpu.row_gemm import RowWidths, rows_times

if TYPE_CHECKING:
    from whisperkv.cpu.step_rows import StepRowsKernel

LAYOUTS = ("rows", "columns", "rows-numpy", "rows-gemm")
#: the layout a CPU float32 model gets unless asked otherwise (fixed: results must not depend on a timing)
DEFAULT_LAYOUT = "rows-gemm"


def column_major(weight: torch.Tensor) -> torch.Tensor:
    """The same [V, d] values stored column-major: ``result.T`` is a contiguous [d, V] tensor."""
    if weight.T.is_contiguous():
        return weight
    return weight.T.contiguous().T


class NumpyRowProjection(nn.Module):
    """``x @ E.T`` with one-row products through NumPy's BLAS (``E @ x``) and PyTorch for the rest.

    Holds the table as a plain attribute, not a parameter: it is the embedding's own tensor, and must
    not appear twice in the state dict (the weights digest is computed over it).
    """

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight.detach()
        self._array = self.weight.numpy()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return x @ self.weight.to(x.dtype).T
        lead, d = x.shape[:-1], x.shape[-1]
        flat = x.reshape(-1, d)
        if flat.shape[0] == 1:
            out = torch.from_numpy(self._array @ flat[0].numpy())
            return out.reshape(*lead, -1)
        return x @ self.weight.T


class ChunkedRowProjection(nn.Module):
    """``x @ E.T`` through ``row_gemm.rows_times``: the table read at GEMM speed, each row's bits its own.

    The table is the embedding's own storage, held as a plain attribute (never a second parameter).
    """

    groups_rows = True  # takes ``sizes`` (see ``row_gemm.linear_rows``)

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight.detach()
        self.widths = RowWidths(self.weight)
        #: the float32 step's linears kernel (``cpu/step_rows.py``) where the model steps through it:
        #: each logit one fixed-order dot product, read at memory speed; None: the chunked GEMMs
        self.kernel: StepRowsKernel | None = None

    def forward(
        self, x: torch.Tensor, sizes: list[int] | None = None, norm: nn.LayerNorm | None = None
    ) -> torch.Tensor:
        """Logits of rows ``x``; ``norm`` first when given (inside the kernel's call where it runs)."""
        if self.kernel is not None and x.dtype == torch.float32 and x.device.type == "cpu":
            rows = x.reshape(-1, x.shape[-1])
            return self.kernel(rows, self.weight, None, norm=norm).reshape(*x.shape[:-1], -1)
        if norm is not None:
            x = norm(x)
        if x.dtype != torch.float32 or x.device.type != "cpu":
            return x @ self.weight.to(x.dtype).T
        rows = x.reshape(-1, x.shape[-1])
        return rows_times(self.weight, rows, self.widths, sizes).reshape(*x.shape[:-1], -1)


def _timings(n_vocab: int, n_state: int, repeats: int) -> dict[str, float]:
    """Median seconds of one 1-row projection per layout, timed in turn on a table of the real size.

    One buffer serves every layout (as [V, d] rows, or the same bytes as a contiguous [d, V]): the
    values do not matter for the time, and one transient table is 80 MB for tiny.en, not 160.
    """
    table = torch.empty(n_vocab, n_state).fill_(0.01)
    columns = table.view(n_state, n_vocab)
    x = torch.full((1, n_state), 0.5)
    x_np = x[0].numpy()
    array = table.numpy()
    pair = torch.cat([x, torch.zeros_like(x)])
    calls = {
        "rows": lambda: x @ table.T,
        "columns": lambda: x @ columns,
        "rows-numpy": lambda: array @ x_np,
        "rows-gemm": lambda: table @ pair.T,
    }
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()  # first calls pay one-off costs (thread pools, page faults)
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def choose_layout(n_vocab: int, n_state: int, repeats: int = 9) -> tuple[str, dict[str, float]]:
    """The fastest layout on this machine now, and every layout's measured median seconds.

    Costs about 0.1 s and one transient table; ``load_model`` measures before reading the weights, so
    the process's peak memory stays that of loading.
    """
    timings = _timings(n_vocab, n_state, repeats)
    return min(timings, key=timings.get), timings


def apply_layout(decoder: nn.Module, layout: str) -> None:
    """Store the decoder's tied table in ``layout`` (one copy) and route its projection accordingly."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown vocabulary layout {layout!r}: one of {', '.join(LAYOUTS)}")
    embedding = decoder.token_embedding
    weight = embedding.weight.detach()
    if weight.dtype == torch.float16:  # the kernel's float16 copy (``use_attention_kernels``): float32 here
        weight = weight.float()
        embedding.weight = nn.Parameter(weight, requires_grad=False)
    blocks = getattr(decoder, "blocks", None)
    kernel = getattr(blocks[0], "step_rows", None) if blocks else None  # as the decoder's steps do
    if not getattr(kernel, "reads_float_tables", False):  # the int8 type's linears kernel reads none
        kernel = None
    if layout == "columns":
        embedding.weight = nn.Parameter(column_major(weight), requires_grad=False)
        decoder.logits_projection = None
        return
    if not weight.is_contiguous():
        embedding.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    projections = {"rows-numpy": NumpyRowProjection, "rows-gemm": ChunkedRowProjection}
    decoder.logits_projection = projections[layout](embedding.weight) if layout in projections else None
    if layout == "rows-gemm":
        decoder.logits_projection.kernel = kernel


def current_layout(decoder: nn.Module) -> str:
    """Which layout a decoder's projection uses now (int8 models report their own projection)."""
    if decoder.logits_projection is not None:
        if isinstance(decoder.logits_projection, NumpyRowProjection):
            return "rows-numpy"
        if isinstance(decoder.logits_projection, ChunkedRowProjection):
            return "rows-gemm"
        return type(decoder.logits_projection).__name__
    return "columns" if decoder.token_embedding.weight.T.is_contiguous() else "rows"
