"""The heap settings ``load_model`` applies (``whisperkv/heap.py``): a window's encoder pass after the first
takes few new pages; with glibc's defaults (``WHISPERKV_HEAP=system``) it takes thousands."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest
import torch

from whisperkv.heap import OPT_OUT, _mallopt, keep_freed_blocks

pytestmark = pytest.mark.skipif(_mallopt() is None, reason="mallopt is glibc's")

#: minor page faults of one encoder pass over a window after the first (run as a script in a subprocess
#: too); the model's first pass takes the pages once
SCRIPT = """
import resource, sys, torch
import whisperkv
model = whisperkv.load_model("tiny.en")
mel = torch.randn(1, model.dims.n_mels, 3000)
with torch.inference_mode():
    model.embed_audio(mel)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model.embed_audio(mel)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _encode_faults(model) -> int:  # noqa: ANN001 - a loaded Whisper
    mel = torch.randn(1, model.dims.n_mels, 3000)
    with torch.inference_mode():
        model.embed_audio(mel)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        model.embed_audio(mel)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_a_loaded_models_later_windows_take_a_fraction_of_the_pages(tiny_model) -> None:
    """The same pass in this process (``load_model`` applied the settings) and in one that opted out:
    glibc's defaults take the window's pages again (5,000+ faults), the settings keep them (~600 left,
    SDPA's per-thread buffers)."""
    assert os.environ.get(OPT_OUT, "") != "system"
    env = {**os.environ, OPT_OUT: "system", "OMP_NUM_THREADS": str(torch.get_num_threads())}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    defaults = int(out.stdout.strip().splitlines()[-1])
    kept = _encode_faults(tiny_model)
    assert defaults > 2000
    assert kept < defaults / 4, (kept, defaults)


def test_opting_out_changes_nothing(monkeypatch) -> None:
    monkeypatch.setenv(OPT_OUT, "system")
    assert keep_freed_blocks() is False
