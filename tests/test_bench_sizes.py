"""``benchmarks/sizes.py`` runs end to end: random weights drawn, converted for CTranslate2, every engine in
its own process, the table and the goal lines printed (tiny shapes, one round: a check, not a timing)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import require_oracle

pytestmark = pytest.mark.oracle
ROOT = Path(__file__).resolve().parents[1]


def test_the_sizes_benchmark_prints_every_engine_and_its_goals():
    require_oracle("ctranslate2")
    engines = "whisperkv-float32,whisperkv-int8,whisperkv-bfloat16,faster-whisper-int8"
    command = [sys.executable, "benchmarks/sizes.py", "--smoke", "--threads", "1", "--engines", engines]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    for engine in engines.split(","):
        row = re.search(rf"^{engine} +([\d.]+) +([\d.]+) +([\d.]+) +(\d+) +(\d+)$", out, re.M)
        assert row, f"no measured row for {engine}:\n{out}"
        load_s, encoder_ms, step_ms, steps, rss = row.groups()
        assert float(encoder_ms) > 0 and float(step_ms) > 0 and int(rss) > 50
        assert int(steps) == 4, f"{engine} took {steps} steps, not the 4 asked for"
    assert re.search(r"^faster-whisper-float32 +not measured$", out, re.M)
    assert "whisperkv-int8 / faster-whisper-int8 per window" in out
    assert "whisperkv-int8 / faster-whisper-int8 per step" in out


def test_an_unknown_engine_is_refused_by_name():
    command = [sys.executable, "benchmarks/sizes.py", "--smoke", "--engines", "whisperkv-int4"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown engines ['whisperkv-int4']" in done.stderr
