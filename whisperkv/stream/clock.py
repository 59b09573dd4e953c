"""Stream time: real (wall clock) or simulated and computation-aware.

whisper_streaming evaluates without waiting for wall time: while an update computes for X s, X s more
audio arrive, so latency counts the computation but nobody sleeps through the audio. ``SimulatedClock``
does that with the measured compute time, or with a fixed cost per update (``--simulate_compute``) so
tests are deterministic. ``RealtimeClock`` paces by the wall clock (``--realtime``).

A span of computation says whether it was an update (``Span.update``): the runner also hands the VAD
new audio between updates, and under a fixed cost such a span costs nothing unless it decoded (an
utterance closed).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Span:
    """One span of computation; the runner sets ``update`` once it knows (an update ran, or a decode)."""

    update: bool = True


class SimulatedClock:
    def __init__(self, fixed_cost: float | None = None) -> None:
        if fixed_cost is not None and fixed_cost < 0:
            raise ValueError(f"--simulate_compute must be at least 0, got {fixed_cost}")
        self.fixed_cost = fixed_cost
        self.now = 0.0
        self.compute = 0.0  # measured compute, whatever the cost model

    def start(self) -> None:
        """Stream time 0 is now (a simulated clock starts at 0 anyway)."""

    def wait_until(self, t: float) -> None:
        self.now = max(self.now, t)

    @contextmanager
    def computing(self) -> Iterator[Span]:
        span, t0 = Span(), time.perf_counter()
        yield span
        measured = time.perf_counter() - t0
        self.compute += measured
        if self.fixed_cost is None:
            self.now += measured
        elif span.update:
            self.now += self.fixed_cost


class RealtimeClock:
    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.compute = 0.0

    @property
    def now(self) -> float:
        return time.perf_counter() - self.origin

    def start(self) -> None:
        """Stream time 0 is now: what ran before (loading, warming) is not counted as stream time."""
        self.origin = time.perf_counter()

    def wait_until(self, t: float) -> None:
        delay = t - self.now
        if delay > 0:
            time.sleep(delay)

    @contextmanager
    def computing(self) -> Iterator[Span]:
        t0 = time.perf_counter()
        yield Span()
        self.compute += time.perf_counter() - t0
