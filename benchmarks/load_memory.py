"""Memory of loading a model: resident set after ``import torch``, after ``load_model``, and the peak.

    PYTHONPATH=. .venv/bin/python benchmarks/load_memory.py [--models tiny.en,base] [--compute_types int8]
    PYTHONPATH=. .venv/bin/python benchmarks/load_memory.py --models small,large-v3-turbo \\
        --work_dir /tmp/sizes-work --compute_types float32,int8,bfloat16 --peers

Each measurement runs in a fresh interpreter, so one load's high-water mark never hides another's: the
peak is the process's VmHWM (``ru_maxrss`` would carry the forking parent's over the exec). It only
calls ``whisperkv.load_model``: pointing PYTHONPATH at an older checkout measures that one the same way
(how the "before" figures of a loader change are taken).

A model is a name (``tiny.en``, ``base``), a path, or, with ``--work_dir``, a size whose random weights
``benchmarks/sizes.py`` wrote there (``DIR/SIZE/pt/model.pt``: float16, drawn from the size's seed;
made here if missing). ``--peers`` also loads CTranslate2 (faster-whisper's engine, as ``sizes.py``
drives it, no torch imported) from the same weights converted (``DIR/SIZE/ct2-float32``, ``ct2-int8``;
tiny.en's packaged directory), each in its own process too, float32 and int8.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import describe  # noqa: E402

PEAK = """
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
"""

CHILD = (
    PEAK
    + """
import json, sys, time
import torch
after_torch = rss()
import whisperkv
started = time.perf_counter()
model = whisperkv.load_model(sys.argv[1], compute_type=sys.argv[2])
seconds = time.perf_counter() - started
print(json.dumps({"torch": after_torch, "loaded": rss(), "package": whisperkv.__file__, "peak": peak(),
                  "seconds": seconds}))
"""
)

PEER = (
    PEAK
    + """
import json, sys, time
import ctranslate2
after_import = rss()
started = time.perf_counter()
model = ctranslate2.models.Whisper(sys.argv[1], device="cpu", compute_type=sys.argv[2], intra_threads=2)
seconds = time.perf_counter() - started
print(json.dumps({"torch": after_import, "loaded": rss(), "package": "ctranslate2 " + ctranslate2.__version__,
                  "peak": peak(), "seconds": seconds}))
"""
)


def _run(code: str, *argv: str) -> dict | str:
    """One child interpreter (outside this checkout: its directory would come before PYTHONPATH)."""
    out = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    if out.returncode:
        return f"failed: {out.stderr.strip().splitlines()[-1:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def _weights(model: str, work_dir: str | None) -> tuple[str, dict[str, str]]:
    """What ``load_model`` is given for ``model``, and the CTranslate2 directory per compute type."""
    if model == "tiny.en":
        from whisperkv.weights.registry import _tiny_en_dir

        ct2 = str(_tiny_en_dir())
        return model, {"float32": ct2, "int8": ct2}
    if work_dir is None or model == "base" or Path(model).exists():
        return model, {}
    from sizes import _prepare

    directory = Path(work_dir) / model
    directory.mkdir(parents=True, exist_ok=True)
    paths = _prepare(model, directory, False, ["faster-whisper-float32", "faster-whisper-int8"])
    return paths["pt"], {kind: paths[f"faster-whisper-{kind}"] for kind in ("float32", "int8")}


def _row(label: str, compute: str, r: dict | str) -> str:
    if isinstance(r, str):
        return f"{label:<16}{compute:<12} {r}"
    return (
        f"{label:<16}{compute:<12}{r['torch']:>12.0f}{r['loaded']:>15.0f}{r['peak']:>9.0f}"
        f"{r['peak'] - r['loaded']:>13.0f}{r['seconds']:>8.1f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--compute_types", default="default,int8")
    p.add_argument("--work_dir", help="sizes' random weights (DIR/SIZE/pt/model.pt), made there if missing")
    p.add_argument("--peers", action="store_true", help="CTranslate2 on the same weights, too")
    args = p.parse_args()
    print(describe(1))
    packages = set()
    header = f"{'model':<16}{'compute':<12}{'import MB':>12}{'after load MB':>15}{'peak MB':>9}"
    print(f"\n{header}{'peak - after':>13}{'load s':>8}")
    for model in args.models.split(","):
        path, peers = _weights(model, args.work_dir)
        for compute in args.compute_types.split(","):
            r = _run(CHILD, path, compute)
            if isinstance(r, dict):
                packages.add(str(Path(r["package"]).parent))
            print(_row(model, compute, r), flush=True)
        for compute, directory in peers.items() if args.peers else ():
            r = _run(PEER, directory, compute)
            print(_row(model, f"ct2 {compute}", r), flush=True)
    print(f"whisperkv measured: {', '.join(sorted(packages))}")
    print("import MB: RSS after import torch (ctranslate2 for the ct2 rows); peak: VmHWM of the process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
