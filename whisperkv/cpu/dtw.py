"""Word timing's dynamic time warping through the kernels' library (``kernels/dtw.c``).

Why: the numpy twin (``timing_signal.dtw_numpy``) takes 12.5 ms for a streaming update's ~40 tokens by
~400 frames (2-core Zen 3; an update of tiny.en int8 costs ~0.4 s), the C fill and backtrace 0.11 ms,
with the same path, cell for cell (tested against the twin on random, tied and real matrices). Where
the library is not built, or the matrix holds a value the C fill does not take (not finite, or large
enough to reach its border sentinel), ``path`` returns None and the twin runs.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from whisperkv.cpu.attend import kernel_function

#: the largest |cost| the C fill takes: sums of n + m of them stay far below its border (DBL_MAX)
MAX_COST = 1e30


@functools.cache
def _kernel_fn() -> ctypes._CFuncPtr | None:
    pointer, long = ctypes.c_void_p, ctypes.c_long
    return kernel_function("wkv_dtw", long, [pointer, long, long, pointer, pointer])


def path(x: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(rows, cols) of the minimum-cost path through ``x`` [n, m] (float64), or None: use the twin."""
    fn = _kernel_fn()
    n, m = x.shape
    if fn is None or n == 0 or m == 0:
        return None
    x = np.ascontiguousarray(x, dtype=np.float64)
    if not np.isfinite(x).all() or np.abs(x).max() * (n + m) > MAX_COST:
        return None
    rows = np.empty(n + m, dtype=np.int64)
    cols = np.empty(n + m, dtype=np.int64)
    count = fn(x.ctypes.data, n, m, rows.ctypes.data, cols.ctypes.data)
    if count < 0:  # the steps' buffer could not be allocated
        return None
    return rows[:count], cols[:count]
