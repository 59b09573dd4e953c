"""Memory of loading a model: resident set after ``import torch``, after ``load_model``, and the peak.

    PYTHONPATH=. .venv/bin/python benchmarks/load_memory.py [--models tiny.en,base] [--compute_types int8]

Each measurement runs in a fresh interpreter, so one load's high-water mark never hides another's. It
only calls ``whisperkv.load_model``: pointing PYTHONPATH at an older checkout measures that one the same
way (how the figures before the memory-mapped loader were taken).
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

CHILD = """
import json, resource, sys
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
import torch
after_torch = rss()
import whisperkv
model = whisperkv.load_model(sys.argv[1], compute_type=sys.argv[2])
print(json.dumps({"torch": after_torch, "loaded": rss(), "package": whisperkv.__file__,
                  "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "weights": sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20}))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--compute_types", default="default,int8")
    args = p.parse_args()
    print(describe(1))
    packages = set()
    header = f"{'model':<9}{'compute':<9}{'after torch MB':>15}{'after load MB':>15}"
    print(f"\n{header}{'peak MB':>9}{'load adds':>11}")
    for model in args.models.split(","):
        for compute in args.compute_types.split(","):
            out = subprocess.run(  # not run in this checkout: its directory would come before PYTHONPATH
                [sys.executable, "-c", CHILD, model, compute],
                capture_output=True,
                text=True,
                check=False,
                cwd=tempfile.gettempdir(),
            )
            if out.returncode:
                print(f"{model:<9}{compute:<9} failed: {out.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            packages.add(str(Path(r["package"]).parent))
            print(
                f"{model:<9}{compute:<9}{r['torch']:>15.0f}{r['loaded']:>15.0f}{r['peak']:>9.0f}"
                f"{r['peak'] - r['torch']:>11.0f}"
            )
    print(f"whisperkv measured: {', '.join(sorted(packages))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
