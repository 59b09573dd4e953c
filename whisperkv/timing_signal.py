"""The two signal steps of word timing: a median filter along time, and dynamic time warping.

Split from ``timing.py`` so that module holds the alignment itself. The names ``median_filter``,
``dtw_cpu`` and ``dtw_cuda`` are openai-whisper's (``whisper.timing``), with its signatures and results:
its own tests run against these (``tests/test_openai_whisper_suite.py``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def median_filter(x: torch.Tensor, filter_width: int) -> torch.Tensor:
    """Median over a sliding window of odd ``filter_width`` along the last axis, edges mirrored (reflect).

    With reflect padding the edge sample itself is not repeated: ``[a, b, c, …]`` is padded as
    ``[…, c, b, a, b, c, …]``. An axis no longer than ``filter_width // 2`` cannot be mirrored and is returned
    unchanged. The reference's signature (``whisper.timing.median_filter``).
    """
    width = filter_width
    if width <= 0 or width % 2 != 1:
        raise ValueError(f"median filter width must be a positive odd number, got {width}")
    half = width // 2
    length = x.shape[-1]
    if length <= half:
        return x
    flat = x.reshape(-1, 1, length)  # F.pad reflects the last axis of a [N, C, L] tensor
    padded = F.pad(flat, (half, half), mode="reflect")
    if width == 7 and not bool(x.isnan().any()):  # with NaN: the sort's order, below
        return _median_of_7(padded.reshape(-1, length + 2 * half), length).reshape(x.shape)
    windows = padded.unfold(-1, width, 1)  # [N, 1, L, width]
    smoothed = windows.sort(dim=-1).values[..., half]
    return smoothed.reshape(x.shape)


#: a sorting network of 7 inputs, layer by layer (16 compare-exchanges; every 0/1 input comes out sorted:
#: tests/test_timing.py)
SORT_7 = (
    ((0, 6), (2, 3), (4, 5)),
    ((0, 2), (1, 4), (3, 6)),
    ((0, 1), (2, 5), (3, 4)),
    ((1, 2), (4, 6)),
    ((2, 3), (4, 5)),
    ((1, 2), (3, 4), (5, 6)),
)


def _median_of_7(padded: torch.Tensor, length: int) -> torch.Tensor:
    """The middle of each 7 neighbours [N, length] of ``padded`` [N, length + 6]: the median filter at
    word timing's width through ``SORT_7`` on whole shifted rows, 16 minimums and maximums where the
    sort of every window took ~7x as long (an update of a live stream: ~7 of its ~35 ms of alignment).
    Each output is one of its inputs, as the sort's middle is: the same values."""
    lanes = [padded[:, i : i + length] for i in range(7)]
    for layer in SORT_7:
        for i, j in layer:
            lanes[i], lanes[j] = torch.minimum(lanes[i], lanes[j]), torch.maximum(lanes[i], lanes[j])
    return lanes[3]


def dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum-cost monotonic path through the cost matrix ``x`` [N, M] from (0, 0) to (N-1, M-1).

    Returns ``(rows, cols)``: the path's cells in order. Through the kernels' C fill where it is built
    (``cpu/dtw.py``: the same path, cell for cell), else through ``dtw_numpy``, its twin.
    """
    from whisperkv.cpu.dtw import path  # the kernels' library loads on first use, not on import

    found = path(np.asarray(x, dtype=np.float64))
    return found if found is not None else dtw_numpy(x)


def dtw_numpy(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dtw` in numpy: the C fill's twin, and the path where the kernels are not built.

    Returns ``(rows, cols)``: the path's cells in order. Each step moves one row, one column, or both.
    Ties and float precision follow the reference as it runs (accumulated costs are float64: its
    ``np.ones(..., float32) * np.inf`` is float64 under numba, which types ``np.inf`` as a float64 array
    operand; a diagonal step wins only when strictly cheaper than both others, a vertical one only when
    strictly cheaper than both others, otherwise the horizontal step is taken), so paths agree cell for
    cell. Float32 sums differ from it where two paths' costs differ by less than a float32 rounding.

    The recurrence is filled one anti-diagonal at a time: every cell on diagonal ``i + j = k`` depends
    only on diagonals ``k - 1`` and ``k - 2``, so each diagonal is one vectorised numpy step.
    """
    x = np.asarray(x, dtype=np.float64)
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf, dtype=np.float64)
    cost[0, 0] = 0.0
    trace = np.full((n + 1, m + 1), -1, dtype=np.int8)
    for k in range(2, n + m + 1):
        i = np.arange(max(1, k - m), min(n, k - 1) + 1)
        j = k - i
        c0 = cost[i - 1, j - 1]  # diagonal step
        c1 = cost[i - 1, j]  # advance the row (token) only
        c2 = cost[i, j - 1]  # advance the column (time) only
        diagonal = (c0 < c1) & (c0 < c2)
        vertical = ~diagonal & (c1 < c0) & (c1 < c2)
        step = np.where(diagonal, 0, np.where(vertical, 1, 2)).astype(np.int8)
        best = np.where(diagonal, c0, np.where(vertical, c1, c2))
        cost[i, j] = x[i - 1, j - 1] + best
        trace[i, j] = step
    return _backtrace(trace)


def _backtrace(trace: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    trace = trace.copy()
    trace[0, :] = 2  # on the top edge only time can go back
    trace[:, 0] = 1  # on the left edge only tokens can
    i, j = trace.shape[0] - 1, trace.shape[1] - 1
    path: list[tuple[int, int]] = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        elif step == 2:
            j -= 1
        else:
            raise ValueError(f"DTW trace has no step at ({i}, {j})")
    cells = np.array(path[::-1], dtype=np.int64).reshape(-1, 2)
    return cells[:, 0], cells[:, 1]


def dtw_cpu(x: np.ndarray) -> np.ndarray:
    """The reference's ``dtw_cpu``: the path of :func:`dtw` as one [2, K] array (token row, time column)."""
    rows, cols = dtw(x)
    return np.stack([rows, cols])


def dtw_cuda(x: torch.Tensor, BLOCK_SIZE: int = 1024) -> np.ndarray:  # noqa: N803 - the reference's name
    """The reference's ``dtw_cuda`` name and result, for code that imports it.

    The reference runs a Triton kernel here; whisperkv has none, so the same path is computed on the CPU
    (the cost matrix is one window's tokens x frames: a copy off the device is small). ``BLOCK_SIZE`` is
    accepted and unused.
    """
    return dtw_cpu(x.double().cpu().numpy())
