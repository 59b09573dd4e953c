"""Two ways of running the same model on the same files, alternated in one process: the A/B harness of
``greedy_choice.py`` and ``decoder_step.py``.

On these shared VMs a whole engine's runs minutes apart move by more than a change of 0.2 ms a step:
here each file is transcribed one way then the other, the order swapped every pair, so both ways see
the same machine; medians over the pairs are printed with every run's time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import whisperkv

LONG = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech" / "long"


class StepTimer:
    """Seconds and calls of a timed function since the last ``reset`` (a per-step figure's source)."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def wrap(self, call: Callable) -> Callable:
        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        return timed

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def ms_per_call(self) -> float:
        return self.seconds / max(self.calls, 1) * 1e3


def setting(target: object, name: str, value: object) -> Callable[[], None]:
    """A way's set-up: ``target.name = value`` (this process only)."""
    return lambda: setattr(target, name, value)


def alternate(
    model,  # noqa: ANN001 - whisperkv.model.whisper.Whisper
    ways: dict[str, Callable[[], None]],
    timer: StepTimer,
    pairs: int,
    what: str,
    options: dict | None = None,
) -> None:
    """Per long-form file: each way (its callable sets the model up) ``pairs`` times, alternated; prints
    per way the median whole seconds and the median of ``timer``'s ms per call (``what``), and whether
    the ways' words are the same."""
    options = {"language": "en", **(options or {})}
    names = list(ways)
    print(f"{'file':<42}{'way':<12}{'median s':>10}{what:>18}  runs (s)")
    for path in sorted(LONG.glob("*.flac")):
        audio = whisperkv.load_audio(path)
        model.transcribe(audio, **options)  # first call pays one-off costs
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        texts: dict[str, str] = {}
        for pair in range(pairs):
            for name in names if pair % 2 == 0 else names[::-1]:
                ways[name]()
                timer.reset()
                start = time.perf_counter()
                texts[name] = model.transcribe(audio, **options)["text"]
                runs[name].append((time.perf_counter() - start, timer.ms_per_call()))
        ways[names[0]]()
        for name, measured in runs.items():
            whole = statistics.median(t for t, _ in measured)
            per_call = statistics.median(c for _, c in measured)
            listed = " ".join(f"{t:.2f}" for t, _ in measured)
            print(f"{path.name:<42}{name:<12}{whole:>10.3f}{per_call:>18.3f}  {listed}")
        first, second = (statistics.median(t for t, _ in runs[name]) for name in names)
        same = texts[names[0]].split() == texts[names[1]].split()
        print(f"{'':<42}{names[0]} / {names[1]} {first / second:.2f}; same words: {same}")
