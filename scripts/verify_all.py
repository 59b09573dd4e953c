"""Run the twin check (``whisperkv verify``) on every English clip of ../shared/data/speech; print a summary.

.venv/bin/python scripts/verify_all.py [--beam_size 5] [--max-seconds 30]
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import whisperkv
from whisperkv.verify import verify_file

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--beam_size", type=int, default=None)
    p.add_argument("--max-seconds", type=float, default=30.0)
    args = p.parse_args()
    with open(SPEECH / "manifest.tsv", encoding="utf-8") as f:
        rows = [
            r
            for r in csv.DictReader(f, delimiter="\t")
            if r["language"] == "en" and float(r["duration_s"]) <= args.max_seconds
        ]
    model = whisperkv.load_model(args.model)
    worst: dict[str, float] = {}
    diverged, twin_s, cached_s, tokens = [], 0.0, 0.0, 0
    for r in rows:
        report = verify_file(model, str(SPEECH / r["file"]), beam_size=args.beam_size)
        for name, path in report["paths"].items():
            worst[name] = max(worst.get(name, 0.0), path["max_abs_logit_diff"])
        if not report["identical"]:
            diverged.append((r["id"], report["paths"]))
        twin_s += report["seconds"]["twin"]
        cached_s += report["seconds"]["cached"]
        tokens += report["paths"]["cached"]["tokens"]
        print(f"{r['id']:<32} {'identical' if report['identical'] else 'DIVERGED'}", flush=True)
    print(f"\n{len(rows)} clips, beam {args.beam_size or 'greedy'}: {len(rows) - len(diverged)} identical")
    for name, value in worst.items():
        print(f"  {name:<16} max |Δlogit| over all clips {value:.3g}")
    speedup = twin_s / cached_s
    print(f"  decode time: twin {twin_s:.1f} s, cached {cached_s:.1f} s ({speedup:.1f}x), {tokens} tokens")
    for clip, paths in diverged:
        print("  diverged:", clip, paths)
    return 1 if diverged else 0


if __name__ == "__main__":
    sys.exit(main())
