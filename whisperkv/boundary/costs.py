"""Cost accounting for one window, every stage apart, and the bytes that cross from dimensions alone.

A window's costs: log-Mel, encoder, Cross-KV projection (on whichever side does it), sealing, transfer
(time and bytes both ways), opening, decoding (and per token). Times are wall-clock milliseconds taken
with ``time.perf_counter``; the worker's share comes back in response headers (cost figures only: they
are not sealed, and nothing is decided on them).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from whisperkv.model.dims import KNOWN_DIMS, ModelDims

BYTES_PER_ELEMENT = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass
class WindowCosts:
    """What one window cost, stage by stage (milliseconds, bytes). ``None``: the stage did not run."""

    window_start: int
    window_end: int
    carry: str  # "local" (in process), "features" or "cross_kv"
    log_mel_ms: float | None = None
    encoder_ms: float = 0.0
    projection_ms: float = 0.0
    projection_side: str = "decoder"  # where the Cross-KV was projected
    seal_ms: float = 0.0  # worker sealing its response, plus the decoder sealing the log-Mel request
    transfer_ms: float = 0.0  # round trip minus the worker's own work
    bytes_sent: int = 0
    bytes_received: int = 0
    open_ms: float = 0.0  # decoder opening the response (worker opening the request is in seal_ms' side)
    decode_ms: float = 0.0
    tokens: int = 0
    ms_per_token: float | None = None

    def add_decode(self, ms: float, tokens: int) -> None:
        self.decode_ms += ms
        self.tokens += tokens
        self.ms_per_token = self.decode_ms / self.tokens if self.tokens else None

    def to_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as ms:`` … ``ms[0]`` holds the elapsed milliseconds afterwards."""
    out = [0.0]
    start = time.perf_counter()
    try:
        yield out
    finally:
        out[0] = (time.perf_counter() - start) * 1000


def crossing_bytes(dims: ModelDims, dtype: str) -> dict[str, int]:
    """Bytes of the payload that crosses per window in each carry mode (labels and tags add < 1 KB)."""
    s = BYTES_PER_ELEMENT[dtype]
    return {
        "log_mel": dims.n_mels * 2 * dims.n_audio_ctx * s,
        "features": dims.n_audio_ctx * dims.n_audio_state * s,
        "cross_kv": 2 * dims.n_text_layer * dims.n_audio_ctx * dims.n_text_state * s,
    }


def crossing_table(dtypes: tuple[str, ...] = ("float32", "float16")) -> list[dict]:
    """One row per known size and dtype: log-Mel up, features or Cross-KV down, and their ratio."""
    rows = []
    for name, dims in KNOWN_DIMS.items():
        if name in ("large", "turbo"):  # aliases
            continue
        for dtype in dtypes:
            b = crossing_bytes(dims, dtype)
            rows.append(
                {"model": name, "dtype": dtype, **b, "ratio": round(b["cross_kv"] / b["features"], 2)}
            )
    return rows


def render_crossing_table(rows: list[dict]) -> str:
    lines = [
        "bytes that cross per 30 s window (from the dimensions alone)",
        f"{'model':<15} {'dtype':<8} {'log-Mel up':>12} {'features down':>14} "
        f"{'Cross-KV down':>14} {'ratio':>6}",
    ]
    for r in rows:
        lines.append(
            f"{r['model']:<15} {r['dtype']:<8} {r['log_mel'] / 1e6:>10.2f}MB {r['features'] / 1e6:>12.2f}MB "
            f"{r['cross_kv'] / 1e6:>12.1f}MB {r['ratio']:>5.0f}x"
        )
    return "\n".join(lines)
