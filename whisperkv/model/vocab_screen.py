"""An int8 screen of the vocabulary table: which tokens can hold the largest logit, proven by a bound.

A float32 greedy step of tiny.en reads the 80 MB vocabulary table to find one argmax; the table is the
largest read of the step. The screen keeps an int8 copy (20 MB, one scale per row) and, per token,
the norms of its float32 row and of that row's rounding error. For a hidden row ``h`` (quantised to int8
with its own scale) the int8 product ``a_i`` differs from the float32 logit ``l_i = h · w_i`` by at most

    |l_i - a_i| <= |h - ĥ|·|w_i| + |ĥ|·|w_i - ŵ_i|        (Cauchy-Schwarz, twice)

where ĥ, ŵ_i are the quantised vectors (each element within half a quantisation step of the original).
``bound`` gives that (|h - ĥ| measured, not assumed), widened by a safety factor and the float rounding
of both products. The int8 table is held beside the float32 one, which the exact rows are read from.

The int8 products go through the int8 type's C kernel (``model/int8_rows.py``) where it is built (a CPU
with AVX512-VNNI): it reads the table at memory speed (0.59 against 1.22 ms a step for tiny.en's
table read cold, scratch) and reports |h - ĥ| and |ĥ| of the row it quantised (8 bits with a zero
point). Elsewhere ``torch._int_mm`` multiplies, with h quantised here (symmetric, 127 steps).

A token whose upper bound ``a_i + b_i`` lies below some token's lower bound cannot be the argmax; the
few that remain (a median of 3 on the long-form file) get their exact float32 logits from ``exact``,
whose bits equal those the full product gives (checked on the real table when the screen is built; the
screen refuses to serve where they differ). The decision is therefore the full product's, at int8 cost.
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

import torch
from torch import nn

from whisperkv.model.attend_kernel import load_kernel
from whisperkv.model.int8_rows import LANES, Int8RowsKernel, load_rows_kernel
from whisperkv.model.row_gemm import one_row_times
from whisperkv.model.row_int8 import quantize_rows, row_scales

#: the bound is multiplied by this (measured, 200 steps of the long file: the real error reached at most
#: 14 % of the widened bound)
SAFETY = 1.5
#: at least this many rows in a gathered product: MKL gives a lone gathered row other bits
MIN_GATHER = 8
#: table rows scaled, quantised and packed at a time while the screen is built: temporaries of 0.8 MB
#: (tiny.en). With 4,096 rows their 6 MB left the process 30 MB larger after the build than the 20 MB
#: the screen holds (measured: 53 against 23 MB), its peak 66 MB higher
BLOCK = 512


class ScreenedRows(NamedTuple):
    """``VocabScreen.approximate``'s answer for k hidden rows."""

    approx: torch.Tensor  # [k, V] int8 logits
    activation_error: list[float]  # per row |h - ĥ|
    quantised_norm: list[float]  # per row |ĥ|


class VocabScreen:
    """The int8 copy of a float32 vocabulary table [V, d] and its per-row norms, bound to that table."""

    def __init__(
        self, table: torch.Tensor, kernel: Int8RowsKernel | None = None, projection: nn.Module | None = None
    ) -> None:
        """``kernel``: the int8 rows kernel to multiply with (``load_rows_kernel()``), else ``_int_mm``.
        ``projection``: the full product whose bits the exact rows must have (``ChunkedRowProjection``:
        its ``rows_of``); None: the chunked GEMMs' (a padded chunk of two rows)."""
        self.table = table.detach()
        self.projection = projection
        n_vocab, width = self.table.shape
        self.kernel = kernel if kernel is not None and kernel.takes(width) else None
        self.scale = row_scales(self.table, BLOCK)
        self.row_norm = torch.empty(n_vocab)
        self.error_norm = torch.empty(n_vocab)
        self.row_sum: torch.Tensor | None = None
        self.packed: torch.Tensor | None = None
        self.qtable: torch.Tensor | None = None
        if self.kernel is None:  # torch._int_mm reads the int8 table as it is
            self.qtable = torch.empty(n_vocab, width, dtype=torch.int8)
        else:  # the kernel's layout only: one int8 copy of the table, never two
            self.packed = torch.empty(-(-n_vocab // LANES) * LANES * width, dtype=torch.int8)
            self.row_sum = torch.empty(n_vocab, dtype=torch.int32)
        for start in range(0, n_vocab, BLOCK):  # in blocks: no float32 temporary of the whole table
            block = slice(start, start + BLOCK)
            rows = self.table[block].float()
            qrows = quantize_rows(rows, self.scale[block])
            self.row_norm[block] = rows.norm(dim=1)
            self.error_norm[block] = (rows - qrows * self.scale[block, None]).norm(dim=1)
            if self.qtable is not None:
                self.qtable[block] = qrows
            else:
                packed = self.kernel.pack(qrows)  # BLOCK is a whole number of the kernel's row blocks
                self.packed[start * width : start * width + packed.numel()] = packed
                self.row_sum[block] = qrows.sum(dim=1, dtype=torch.int32)
        #: candidates through the kernels' library (``kernels/screen.c``) where it is built
        self.candidates_kernel = _load_candidates() is not None
        self._slices: dict[tuple[int, int], bool] = {}  # slices of the table checked by ``exact_range``
        self.sound = self._exact_bits_match()

    def serves(self, table: torch.Tensor) -> bool:
        """Whether this screen is for ``table`` as it is now (the same storage: float32, or its exact
        float16 copy) and is sound."""
        return (
            self.sound
            and table.dtype in (torch.float32, torch.float16)
            and table.device.type == "cpu"
            and table.data_ptr() == self.table.data_ptr()
            and table.shape == self.table.shape
        )

    @property
    def int8_bytes(self) -> int:
        """Bytes of the int8 table (one copy, in whichever layout its products read)."""
        return (self.packed if self.packed is not None else self.qtable).nbytes

    def approximate(self, hidden: torch.Tensor) -> ScreenedRows:
        """int8 logits [k, V] of hidden rows [k, d], with what their bounds are made of.

        Each row is quantised on its own, so its logits and bound do not depend on the other rows; the
        products accumulate exactly in int32 (the rows kernel, or ``torch._int_mm``)."""
        if self.kernel is not None:
            approx, error, norm = self.kernel.with_norms(
                hidden, self.packed, self.scale, self.row_sum, self.table.shape[0]
            )
            return ScreenedRows(approx=approx, activation_error=error.tolist(), quantised_norm=norm.tolist())
        step = hidden.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / 127.0  # [k, 1]
        levels = torch.round(hidden / step).clamp(-127, 127)
        quantised = levels * step  # ĥ
        products = torch._int_mm(self.qtable, levels.to(torch.int8).T.contiguous())  # [V, k], exact
        return ScreenedRows(
            approx=torch.mul(products.T, step * self.scale),  # int32 x float32: one pass, float32
            activation_error=(hidden - quantised).norm(dim=1).tolist(),  # |h - ĥ|, measured
            quantised_norm=quantised.norm(dim=1).tolist(),
        )

    def bound(self, rows: ScreenedRows, row: int) -> torch.Tensor:
        """Row ``row``'s bound [V] on |float32 logit - int8 logit|, token by token.

        The two Cauchy-Schwarz terms, widened by ``SAFETY``; then the float rounding of either product
        (a sum of d terms rounds by at most ~d·2^-24 of |ĥ|·|w|: the 3e-5 term, with room to spare)."""
        row_weight, error_weight = self._bound_weights(rows, row)  # each operation rounded as screen.c's
        return (self.row_norm * row_weight).add_(self.error_norm * error_weight).add_(1e-4)

    @staticmethod
    def _bound_weights(rows: ScreenedRows, row: int) -> tuple[float, float]:
        """What the row's bound multiplies |w_i| and |w_i - ŵ_i| by."""
        activation_error, quantised_norm = rows.activation_error[row], rows.quantised_norm[row]
        return SAFETY * activation_error + 3e-5 * quantised_norm, (SAFETY + 3e-5) * quantised_norm

    def candidates(
        self, rows: ScreenedRows, row: int, mask: torch.Tensor, n: int, max_ids: int
    ) -> tuple[torch.Tensor | None, float]:
        """(ids, floor) for row ``row`` over the first ``n`` tokens, with the filters' ``mask`` [V] (0 or
        -inf): ``floor`` is the largest lower bound of an allowed token's logit, ``ids`` (ascending) the
        tokens whose upper bound reaches it — None when there are more than ``max_ids``; none allowed:
        (empty, -inf). Through the library's two passes where it is built (``kernels/screen.c``)."""
        approx = rows.approx[row]
        function = _load_candidates() if self.candidates_kernel else None
        if function is not None and approx.is_contiguous() and mask.is_contiguous():
            ids = torch.empty(max_ids, dtype=torch.int64)
            floor = ctypes.c_float()
            count = function(
                approx.data_ptr(),
                mask.data_ptr(),
                self.row_norm.data_ptr(),
                self.error_norm.data_ptr(),
                *self._bound_weights(rows, row),
                n,
                ids.data_ptr(),
                max_ids,
                ctypes.byref(floor),
            )
            return (None if count > max_ids else ids[:count]), floor.value
        masked = approx[:n] + mask[:n]
        bound = self.bound(rows, row)[:n]
        floor = float((masked - bound).max())
        if floor == float("-inf"):
            return torch.empty(0, dtype=torch.int64), floor
        ids = (masked + bound >= floor).nonzero().squeeze(1)
        return (None if ids.numel() > max_ids else ids), floor

    def exact(self, hidden_row: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Float32 logits of ``ids`` for one hidden row [d], bit for bit what the full product gives."""
        n = ids.numel()
        if n < MIN_GATHER:
            ids = torch.cat([ids, ids.new_zeros(MIN_GATHER - n)])
        rows = self.table.index_select(0, ids)
        return self._times(rows, hidden_row)[:n]

    def exact_range(self, hidden_row: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Float32 logits of ids ``start``..``stop - 1`` (e.g. every timestamp), the full product's bits.

        A slice of the table is read in place; the first use of each slice checks its bits against
        the full product (once), and a slice that differs is gathered instead."""
        key = (start, stop)
        if key not in self._slices:
            probe = torch.randn(self.table.shape[1], generator=torch.Generator().manual_seed(1))
            full = self._times(self.table, probe)[start:stop]
            self._slices[key] = torch.equal(self._times(self.table[start:stop], probe), full)
        if self._slices[key]:
            return self._times(self.table[start:stop], hidden_row)
        return self.exact(hidden_row, torch.arange(start, stop))

    def recheck(self) -> None:
        """Check the exact rows' bits again: the full product changed how it multiplies (its kernel)."""
        self._slices.clear()
        self.sound = self._exact_bits_match()

    def _times(self, rows: torch.Tensor, hidden_row: torch.Tensor) -> torch.Tensor:
        if self.projection is not None:
            return self.projection.rows_of(rows, hidden_row)
        return one_row_times(rows, hidden_row)  # the chunked GEMMs' shape for one row

    def _exact_bits_match(self) -> bool:
        """Gathered products of several sizes give the full product's bits on this table and CPU."""
        d = self.table.shape[1]
        generator = torch.Generator().manual_seed(0)
        hidden = torch.randn(d, generator=generator)
        full = self._times(self.table, hidden)
        n_vocab = self.table.shape[0]
        for n in (1, 2, 7, 8, 9, 31, 64, 1501):
            ids = torch.randperm(n_vocab, generator=generator)[: min(n, n_vocab)].sort().values
            if not torch.equal(self.exact(hidden, ids), full[ids]):
                return False
        return True


@functools.cache
def _load_candidates() -> ctypes._CFuncPtr | None:
    """``wkv_screen_candidates`` from the kernels' library (``load_kernel``, cached as it is), or None
    where it is not built. Not held by the screen: a model holding it could not be deep-copied."""
    built = load_kernel()
    return candidates_function(built.library) if built is not None else None


def candidates_function(library: ctypes.CDLL) -> ctypes._CFuncPtr:
    """A library's ``wkv_screen_candidates`` (``kernels/screen.c``), typed for ``VocabScreen.candidates``."""
    function = library.wkv_screen_candidates
    function.restype = ctypes.c_long
    function.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_float] * 2 + [ctypes.c_long, ctypes.c_void_p]
    function.argtypes += [ctypes.c_long, ctypes.c_void_p]
    return function


def attach_screen(decoder: nn.Module) -> None:
    """Give a float32 CPU decoder with a row-major tied table its screen (``decoder.vocab_screen``)."""
    table = decoder.token_embedding.weight
    if table.dtype != torch.float32 or table.device.type != "cpu" or not table.is_contiguous():
        decoder.vocab_screen = None
        return
    decoder.vocab_screen = VocabScreen(table, load_rows_kernel(), decoder.logits_projection)
