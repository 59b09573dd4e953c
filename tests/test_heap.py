"""The heap settings ``load_model`` applies (``whisperkv/heap.py``): a transcription after the first takes
few new pages; with glibc's default thresholds (``WHISPERKV_HEAP=system``) it takes tens of thousands."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from whisperkv.heap import OPT_OUT, _mallopt, keep_freed_blocks

pytestmark = pytest.mark.skipif(_mallopt() is None, reason="mallopt is glibc's")

#: glibc's mmap and trim thresholds held at their defaults (128 KiB): setting them turns off glibc's
#: sliding of both (mallopt(3)), so each block over 128 KiB is mapped afresh, whatever came before
STATIC_DEFAULTS = "glibc.malloc.mmap_threshold=131072:glibc.malloc.trim_threshold=131072"

#: the minor page faults of three transcriptions of a clip after the first (in a subprocess)
SCRIPT = """
import resource, sys
import whisperkv
model = whisperkv.load_model("tiny.en")
model.transcribe(sys.argv[1])
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model.transcribe(sys.argv[1])
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
"""


def _transcribe_faults(clip: str, env: dict[str, str]) -> list[int]:
    """Minor page faults of each of three transcriptions after the first, in a fresh process (``SCRIPT``).

    Why a fresh process for each side, and three compared by their sum: any one transcription's count
    moves with the process's history. With the settings most take 0 pages, but now and then one takes
    a few hundred or a few thousand (1,003 in one of three here; 4,468 once in a CI worker that had run
    other test files first, when this side ran in the worker)."""
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, clip], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return [int(n) for n in out.stdout.strip().splitlines()[-1].split()]


def test_a_loaded_models_later_windows_take_a_fraction_of_the_pages(speech_dir) -> None:
    """The same transcriptions in a process with the settings (``load_model`` applies them) and in one that
    opted out with glibc's thresholds held at their defaults (``STATIC_DEFAULTS``): there every block
    over 128 KiB is mapped afresh and the window's pages are taken again (64,000-76,000 faults on jfk, in
    every run), the settings keep them (0-1,125).

    Why the thresholds are held: left alone, glibc slides them up to the largest block freed, so its
    count depends on which blocks the process happened to free before (jfk: 2,860-28,747 in one run of
    three transcriptions against another; 626 once in a CI run, when the encoder's GELUs ran in place).
    A test of the settings against that twin failed with allocation patterns that had nothing to do
    with them; against the held defaults it compares the settings with what glibc does to a block it has
    not yet slid its threshold over (and to any block over 32 MB, always)."""
    clip = str(speech_dir / "en" / "jfk.flac")
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    env.pop(OPT_OUT, None)
    kept = _transcribe_faults(clip, env)
    defaults = _transcribe_faults(clip, {**env, OPT_OUT: "system", "GLIBC_TUNABLES": STATIC_DEFAULTS})
    assert sum(defaults) > 30000, defaults
    assert sum(kept) < sum(defaults) / 20, (kept, defaults)


def test_opting_out_changes_nothing(monkeypatch) -> None:
    monkeypatch.setenv(OPT_OUT, "system")
    assert keep_freed_blocks() is False


#: the process's peak RSS in MB once the int8 model is loaded
LOAD_PEAK = """
import resource
import whisperkv
whisperkv.load_model("tiny.en", compute_type="int8")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def _load_peak_mb(heap: str) -> int:
    env = {**os.environ, OPT_OUT: heap}
    out = subprocess.run(
        [sys.executable, "-c", LOAD_PEAK], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


def test_the_settings_come_after_the_weights(monkeypatch) -> None:
    """``load_model`` applies the settings last: after the checkpoint's tensors became the model and the
    int8 type's copies were made, so the loader's transient copies go back to the system. Applied
    before, the int8 model's load peaked 38 MB higher (584 against 546 MB), over faster-whisper int8's
    peak on a short clip in the benchmark (round 14); the load's peak itself, with and without them, is
    the slow test below."""
    import whisperkv.load as model_module

    steps: list[str] = []

    def record(name, fn):  # noqa: ANN001, ANN202
        def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            steps.append(name)
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(
        model_module, "model_from_checkpoint", record("weights", model_module.model_from_checkpoint)
    )
    monkeypatch.setattr(model_module, "quantize_int8", record("int8", model_module.quantize_int8))
    monkeypatch.setattr(model_module, "keep_freed_blocks", record("settings", lambda: False))
    model_module.load_model("tiny.en", compute_type="int8")
    model_module.load_model("tiny.en")
    assert steps == ["weights", "int8", "settings", "weights", "settings"]


@pytest.mark.slow
def test_the_settings_do_not_raise_the_peak_of_loading() -> None:
    """The load's peak RSS with the settings against glibc's defaults (each in its own process). Loads
    measured 545-555 MB with them and 550-556 without in round 14. Slow, not default: any load's peak can
    also sit ~75 MB higher than the next one's (the size of tiny.en's weights file), with or without the
    settings (in round 17: 549, 549, 559, 475, 479, 474 MB in a run of alternating loads), so the lowest
    of each kind is compared, with up to three loads of each while the settings' lowest is over."""
    kept, system = [], []
    for _ in range(3):
        kept.append(_load_peak_mb("keep"))
        system.append(_load_peak_mb("system"))
        if min(kept) <= min(system) + 12:
            break
    assert min(kept) <= min(system) + 12, (kept, system)
