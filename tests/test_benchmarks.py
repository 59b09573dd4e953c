"""The benchmark scripts' code paths run (on CPU, tiny shapes): a GPU session can trust them to start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from whisperkv.batched import speech_frames, split_at_silences

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_runs_its_path_on_cpu():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--smoke"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "smoke (random)" in proc.stdout and "dec tok/s" in proc.stdout


def test_energy_vad_cuts_at_the_pause():
    rate = 16000
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(20 * rate) / rate)).astype(np.float32)
    pause = np.zeros(rate, dtype=np.float32)
    audio = np.concatenate([pause, tone, pause, tone, pause])  # 1 + 20 + 1 + 20 + 1 s
    assert speech_frames(audio).sum() == 2 * 20 * 50
    chunks = split_at_silences(audio)
    assert len(chunks) == 2
    for chunk, start in zip(chunks, (1.0, 22.0)):
        assert abs(chunk.start / rate - start) < 0.03
        assert 19.9 < (chunk.end - chunk.start) / rate < 20.2
    # 45 s of continuous speech has no pause: cut hard at 30 s
    hard = split_at_silences(np.concatenate([tone, tone, tone[: 5 * rate]]))
    assert [round((c.end - c.start) / rate) for c in hard] == [30, 15]
