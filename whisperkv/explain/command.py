"""``whisperkv explain FILE [--out DIR] [--window K] [--json]``: write DIR/index.html and its pictures."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parser(sub) -> None:
    from whisperkv.cli_options import optional as _optional

    p = sub.add_parser(
        "explain",
        help="draw one window's journey through the model (HTML page with pictures)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("audio", help="audio file")
    p.add_argument("--model", default="tiny.en", help="model name (tiny.en, base) or path")
    p.add_argument("--language", default=None, help="language code (default: detect, or the model's)")
    p.add_argument("--beam_size", type=_optional(int), default=None, help="beams (default: greedy)")
    p.add_argument("--window", type=int, default=0, help="which decoded 30 s window to explain (0 = first)")
    p.add_argument("--out", default="explain", help="folder for index.html and its images")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON on stdout (no page)")


def run(args: argparse.Namespace) -> int:
    from whisperkv.explain.trace import trace_window
    from whisperkv.load import load_model

    if args.beam_size is not None and args.beam_size < 1:
        print(f"whisperkv: error: --beam_size must be at least 1, got {args.beam_size}", file=sys.stderr)
        return 2
    if args.window < 0:
        print(f"whisperkv: error: --window must be at least 0, got {args.window}", file=sys.stderr)
        return 2
    from whisperkv.cli_options import unreadable_input

    why = unreadable_input(args.audio)  # before the model loads: said at once
    if why is not None:
        print(f"whisperkv: error: {args.audio}: {why}", file=sys.stderr)
        return 2
    model = load_model(args.model)
    trace = trace_window(model, args.audio, args.window, args.language, args.beam_size)
    if args.json:
        print(json.dumps(trace.to_json(), indent=1))
        return 0
    from whisperkv.explain.figures import draw_all
    from whisperkv.explain.page import render_page
    from whisperkv.writers import write_atomic

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"whisperkv: error: --out {out} is a file, not a folder", file=sys.stderr)
        return 2
    images = draw_all(trace, out)
    write_atomic(str(out / "index.html"), render_page(trace, images))
    print(out / "index.html")
    return 0
