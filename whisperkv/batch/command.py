"""``whisperkv batch INPUT... --output_dir DIR``: many files, resumable and checkable, here or on Ray.

The decoding options have the names and defaults of ``whisperkv transcribe`` (beam 5, the fallback
schedule), so each file's outputs are those ``whisperkv transcribe`` writes for it.
"""

from __future__ import annotations

import argparse
import os
import sys


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def add_parser(sub) -> None:
    from whisperkv.cli_options import add_decoding_args, add_parser, optional, positive_int
    from whisperkv.writers import SUPPORTED_FORMATS

    p = add_parser(
        sub, "batch", "transcribe many files (folders, manifests), resumable, on local processes or Ray"
    )
    opt = p.add_argument
    opt("inputs", nargs="+", metavar="INPUT", help="files, folders, or manifests (.txt/.csv/.tsv/.jsonl)")
    opt("--output_dir", "-o", required=True, help="outputs and results.jsonl go here")
    opt("--engine", default="local", choices=["local", "ray"], help="where the workers run")
    opt("--ray_address", default=None, help="auto or HOST:PORT of a Ray cluster (default: a local Ray)")
    opt("--workers", type=positive_int, default=1, help="worker processes / Ray actors")
    opt("--verify", type=optional(positive_int), default=None, metavar="K", help="re-transcribe K done files")
    opt("--output_format", "-f", default="all", choices=[*SUPPORTED_FORMATS, "all"], help="all: every format")
    opt("--model", default="tiny.en", help="model name (tiny.en, base) or path")
    opt(
        "--compute_type",
        default="default",
        choices=["default", "float32", "int8", "bfloat16"],
        help="int8 or bfloat16: approximations; default: float32 on CPU",
    )
    opt(
        "--threads",
        type=positive_int,
        default=None,
        help="torch threads per worker (default: cores / workers)",
    )
    opt("--debug", action="store_true", help="show the traceback of an unexpected error")
    add_decoding_args(p)  # transcribe's options, names and defaults: a file's outputs are transcribe's


def transcribe_options(args: argparse.Namespace) -> dict:
    """The transcribe() options of the job (the same mapping ``whisperkv transcribe`` uses)."""
    from whisperkv.cli_options import transcribe_options as options_from_args

    options = options_from_args(args, args.language)
    options.pop("verbose")  # workers print no segments
    return options


def run(args: argparse.Namespace) -> int:
    from whisperkv.batch.inputs import InputError, expand_inputs
    from whisperkv.batch.job import run_batch
    from whisperkv.batch.work import JobSpec
    from whisperkv.cli_options import unreadable_input
    from whisperkv.options_check import OptionError, check_transcribe_options

    options = transcribe_options(args)
    try:
        check_transcribe_options(None, options)
    except OptionError as err:
        print(f"whisperkv batch: error: argument --{err.option}: {err.reason}", file=sys.stderr)
        return 2
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        print(
            f"whisperkv batch: error: --output_dir {args.output_dir} is a file, not a folder", file=sys.stderr
        )
        return 2
    try:  # before the model loads: a missing input is said at once
        items = expand_inputs(args.inputs)
    except InputError as err:
        print(f"whisperkv batch: error: {err}", file=sys.stderr)
        return 2
    unreadable = [(item.path, unreadable_input(item.path)) for item in items]
    if items and all(why is not None for _, why in unreadable):  # nothing to do: said before any load
        for path, why in unreadable:
            print(f"whisperkv batch: error: {path}: {why}", file=sys.stderr)
        return 1
    threads = args.threads or max(1, _cores() // args.workers)
    spec = JobSpec(
        args.model, args.compute_type, options, args.output_dir, args.output_format, threads=threads
    )
    model = spec.load_model()
    if not model.is_multilingual and (
        options["language"] not in (None, "en") or options["task"] == "translate"
    ):
        print(f"whisperkv batch: error: {args.model} is English-only; use --model base", file=sys.stderr)
        return 2
    report = run_batch(items, spec, model, args.engine, args.workers, args.ray_address, args.verify or 0)
    differing = [(path, why) for path, why in report.verified if why is not None]
    if report.verified:
        print(
            f"whisperkv batch: verify: {len(report.verified) - len(differing)} of {len(report.verified)} "
            "re-transcribed files identical",
            file=sys.stderr,
        )
        for path, why in differing:
            print(f"whisperkv batch: verify: {path}: {why}", file=sys.stderr)
    return 1 if (report.summary["failed"] or differing) else 0
