"""Drive a session from a source of samples on a clock: wait for a chunk, feed it, update, repeat.

The session is warmed first and the clock started after it: everything the first update needs is loaded
before the first sample arrives. The next update starts once ``chunk`` seconds of new audio have
arrived — at once if the last update took longer than that, with everything that arrived meanwhile
(nothing is skipped: a slow stream lags). Each event is stamped with the stream time at which it was
emitted (after the computation that produced it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np

from whisperkv.stream.clock import RealtimeClock, SimulatedClock
from whisperkv.stream.events import Event
from whisperkv.stream.session import SAMPLE_RATE, StreamingSession


class SampleSource(Protocol):
    def read(self, n: int) -> np.ndarray:
        """Up to ``n`` samples (16 kHz float32); fewer only at the end of input."""
        ...


def run_stream(
    source: SampleSource,
    session: StreamingSession,
    clock: SimulatedClock | RealtimeClock,
    chunk: float = 1.0,
    warm: bool = True,
) -> Iterator[Event]:
    if chunk <= 0:
        raise ValueError(f"--chunk must be above 0 s, got {chunk}")
    if warm:
        session.warm()
    clock.start()
    fed = 0
    while True:
        clock.wait_until(fed / SAMPLE_RATE + chunk)
        wanted = max(int(clock.now * SAMPLE_RATE) - fed, 1)
        samples = source.read(wanted)
        ended = len(samples) < wanted
        with clock.computing():
            events = session.feed(samples)
            events += session.finish() if ended else session.update()
        fed += len(samples)
        for event in events:
            event.audio_time = clock.now
            yield event
        if ended:
            return
