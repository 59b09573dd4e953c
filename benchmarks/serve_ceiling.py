"""The encoder-bound ceiling of a serving run (used by ``benchmarks/serve.py``).

Every request pays at least one whole 30 s encoder pass per window, however short its clip, so on a CPU
the encoder bounds short-clip throughput: were every decoder step free, a server would transcribe
``audio seconds / (windows × encoder seconds per window)`` audio seconds per second. Two measures of the
encoder's time per window, both taken in the same run as the level they judge:

- the probe (the ceiling the goal is judged against): right before a level, a process of its own loads
  the same model and compute type from the same checkout, and encodes padded 30 s windows of the
  workload's clips one at a time as the server's scheduler does (encoder, then the Cross-KV projection),
  median over a few rounds after one untimed window. Nothing else of the benchmark runs meanwhile, so
  it is the encoder's own speed on this machine, not slowed by the server's other threads.
- the server's own count (``whisperkv_encoder_seconds`` / ``whisperkv_windows_encoded`` on /metrics,
  read before and after the level; absent from servers older than the count): how many windows the
  level really encoded (a long file's seeks make more than its length / 30 s) and their time under load.

The ceiling uses the server's window count where it has one, else one window per started 30 s.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: windows the probe times per round, rounds it takes the median of
PROBE_WINDOWS = 4
PROBE_ROUNDS = 3
#: the fraction of the ceiling issue 46 asks of 16 clients on short clips
CEILING_GOAL = 0.9


@dataclass(frozen=True)
class EncoderCount:
    """The server's counters at one moment (None where the server does not count)."""

    windows: float | None
    seconds: float | None

    def since(self, before: EncoderCount) -> EncoderCount:
        if None in (self.windows, self.seconds, before.windows, before.seconds):
            return EncoderCount(None, None)
        return EncoderCount(self.windows - before.windows, self.seconds - before.seconds)


def read_encoder_count(port: int) -> EncoderCount:
    """The encoder counters from the server's /metrics (Prometheus text)."""
    import httpx

    values: dict[str, float] = {}
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    except httpx.HTTPError:
        return EncoderCount(None, None)
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("whisperkv_windows_encoded_total", "whisperkv_encoder_seconds_total"):
            values[name] = float(value)
    return EncoderCount(
        values.get("whisperkv_windows_encoded_total"), values.get("whisperkv_encoder_seconds_total")
    )


def probe(repo: Path, compute_type: str, clip_paths: list[Path]) -> float:
    """The encoder's ms per window (median), measured in a process of its own from ``repo``'s code
    (``compute_type`` as ``whisperkv serve --compute_type`` takes it)."""
    env = {**os.environ, "PYTHONPATH": str(repo)}
    command = [sys.executable, __file__, compute_type, *map(str, clip_paths[:PROBE_WINDOWS])]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True, timeout=1800)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["ms_per_window"])


def _probe_here(compute_type: str, paths: list[str]) -> float:
    """In this process: load, encode one window untimed, then the windows one at a time per round."""
    import torch

    import whisperkv
    from whisperkv.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim

    model = whisperkv.load_model("tiny.en", compute_type=compute_type)
    mels = [
        pad_or_trim(
            log_mel_spectrogram(whisperkv.load_audio(p), model.dims.n_mels, padding=N_SAMPLES), N_FRAMES
        )
        for p in paths
    ]

    def encode(mel: torch.Tensor) -> None:
        mel = mel[None]
        features = model.embed_audio(mel)
        model.decoder.project_cross_kv(features, model.encoder_provenance(mel))

    rounds = []
    with torch.no_grad():
        encode(mels[0])
        for _ in range(PROBE_ROUNDS):
            started = time.perf_counter()
            for mel in mels:
                encode(mel)
            rounds.append((time.perf_counter() - started) * 1000 / len(mels))
    return statistics.median(rounds)


@dataclass
class Ceiling:
    """A level's encoder-bound ceiling and how much of it the level reached."""

    probe_ms: float | None  # the probe's ms per window
    windows: int  # windows the level encoded (the server's count, else estimated)
    counted: bool  # whether ``windows`` is the server's own count
    server_ms: float | None  # the server's own ms per window under load
    audio_s: float
    wall_s: float

    @property
    def audio_per_s(self) -> float | None:
        """Audio seconds per second were every decoder step free (the probe's encoder speed)."""
        if not self.probe_ms or not self.windows:
            return None
        return self.audio_s / (self.windows * self.probe_ms / 1000)

    @property
    def fraction(self) -> float | None:
        ceiling = self.audio_per_s
        return None if ceiling is None else (self.audio_s / self.wall_s) / ceiling

    def describe(self) -> str:
        if self.audio_per_s is None:
            return "ceiling: not measured"
        source = "counted by the server" if self.counted else "estimated: one per started 30 s"
        line = (
            f"encoder-bound ceiling {self.audio_per_s:.2f} audio s/s ({self.windows} windows, {source}; "
            f"probe {self.probe_ms:.1f} ms/window): reached {self.fraction:.2f} of it"
        )
        if self.server_ms is not None:
            busy = self.windows * self.server_ms / 1000 / self.wall_s
            line += (
                f"; in the server {self.server_ms:.1f} ms/window, encoder busy {busy:.0%} of the wall time"
            )
        return line


def ceiling(
    probe_ms: float | None, count: EncoderCount, seconds: list[float], audio_s: float, wall_s: float
) -> Ceiling:
    """The level's ceiling from the probe and the server's counts (``seconds``: each request's audio)."""
    counted = count.windows is not None and count.windows > 0
    windows = int(count.windows) if counted else sum(max(1, math.ceil(s / 30)) for s in seconds)
    server_ms = count.seconds * 1000 / count.windows if counted and count.seconds is not None else None
    return Ceiling(probe_ms, windows, counted, server_ms, audio_s, wall_s)


if __name__ == "__main__":
    print(json.dumps({"ms_per_window": _probe_here(sys.argv[1], sys.argv[2:])}))
