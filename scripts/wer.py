"""Word error rate of whisperkv on the English clips of ../shared/data/speech (prints per clip and total).

.venv/bin/python scripts/wer.py [--model tiny.en] [--beam_size 5] [--max-seconds 30]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import whisperkv
from whisperkv.metrics import word_errors

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--beam_size", type=int, default=None)
    p.add_argument("--max-seconds", type=float, default=30.0, help="skip clips longer than this")
    p.add_argument("--speech-dir", default=str(SPEECH))
    args = p.parse_args()
    speech = Path(args.speech_dir)
    if not (speech / "manifest.tsv").is_file():
        print(f"no manifest.tsv under {speech}", file=sys.stderr)
        return 2
    rows = [
        r
        for r in csv.DictReader(open(speech / "manifest.tsv", encoding="utf-8"), delimiter="\t")
        if r["language"] == "en" and float(r["duration_s"]) <= args.max_seconds
    ]
    model = whisperkv.load_model(args.model)
    total_errors = total_words = 0
    start = time.perf_counter()
    for r in rows:
        text = model.transcribe(str(speech / r["file"]), beam_size=args.beam_size)["text"]
        errors, words = word_errors(r["reference"], text)
        total_errors += errors
        total_words += words
        print(f"{r['id']:<32} WER {errors / max(words, 1):6.1%}  {text.strip()[:70]}")
    elapsed = time.perf_counter() - start
    print(
        f"\n{len(rows)} clips, {total_words} reference words: WER {total_errors / total_words:.2%} "
        f"(model {args.model}, beam {args.beam_size or 'greedy'}, {elapsed:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
