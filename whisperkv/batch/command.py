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
    from whisperkv.cli_options import optional as _optional
    from whisperkv.cli_options import positive_int
    from whisperkv.cli_options import str2bool as _str2bool
    from whisperkv.writers import SUPPORTED_FORMATS

    p = sub.add_parser(
        "batch",
        help="transcribe many files (folders, manifests), resumable, on local processes or Ray",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "inputs", nargs="+", metavar="INPUT", help="files, folders, or manifests (.txt/.csv/.tsv/.jsonl)"
    )
    p.add_argument("--output_dir", "-o", required=True, help="outputs and results.jsonl go here")
    p.add_argument("--engine", default="local", choices=["local", "ray"], help="where the workers run")
    p.add_argument(
        "--ray_address", default=None, help="auto or HOST:PORT of a Ray cluster (default: a local Ray)"
    )
    p.add_argument("--workers", type=positive_int, default=1, help="worker processes / Ray actors")
    p.add_argument(
        "--verify", type=int, default=0, metavar="K", help="re-transcribe K done files and compare"
    )
    p.add_argument(
        "--output_format",
        "-f",
        default="all",
        choices=[*SUPPORTED_FORMATS, "all"],
        help="output files per input (all: every format)",
    )
    p.add_argument("--model", default="tiny.en", help="model name (tiny.en, base) or path")
    p.add_argument(
        "--compute_type",
        default="default",
        choices=["default", "float32", "int8"],
        help="int8: faster, an approximation",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: cores / workers)")
    p.add_argument(
        "--language", default=None, help="language of every file (a manifest may give one per file)"
    )
    p.add_argument(
        "--task", default="transcribe", choices=["transcribe", "translate"], help="translate: into English"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="first temperature of the schedule")
    p.add_argument(
        "--temperature_increment_on_fallback",
        type=_optional(float),
        default=0.2,
        help="temperature step of retries (none: no retry)",
    )
    p.add_argument("--best_of", type=_optional(int), default=5, help="samples per temperature > 0")
    p.add_argument(
        "--beam_size", type=_optional(int), default=5, help="beams at temperature 0 (none: greedy)"
    )
    p.add_argument("--patience", type=float, default=None, help="beam search patience")
    p.add_argument("--length_penalty", type=float, default=None, help="alpha of the length penalty, 0 to 1")
    p.add_argument("--initial_prompt", default=None, help="text the first window is told was said before it")
    p.add_argument(
        "--condition_on_previous_text",
        type=_str2bool,
        default=True,
        help="prompt each window with the previous text",
    )
    p.add_argument(
        "--compression_ratio_threshold",
        type=_optional(float),
        default=2.4,
        help="retry a window more repetitive than this",
    )
    p.add_argument(
        "--logprob_threshold",
        type=_optional(float),
        default=-1.0,
        help="retry a window less probable than this",
    )
    p.add_argument(
        "--no_speech_threshold",
        type=_optional(float),
        default=0.6,
        help="skip a silent window above this no-speech probability",
    )
    p.add_argument(
        "--word_timestamps",
        type=_str2bool,
        default=False,
        help="word-level timestamps (alignment heads + DTW)",
    )


def transcribe_options(args: argparse.Namespace) -> dict:
    from whisperkv.cli_options import temperature_schedule as _temperatures

    for name in ("beam_size", "best_of"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be at least 1 (or none), got {value}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must be at least 0, got {args.temperature}")
    if args.verify < 0:
        raise ValueError(f"--verify must be at least 0, got {args.verify}")
    return {
        "task": args.task,
        "language": args.language,
        "temperature": _temperatures(args.temperature, args.temperature_increment_on_fallback),
        "best_of": args.best_of,
        "beam_size": args.beam_size,
        "patience": args.patience,
        "length_penalty": args.length_penalty,
        "initial_prompt": args.initial_prompt,
        "condition_on_previous_text": args.condition_on_previous_text,
        "compression_ratio_threshold": args.compression_ratio_threshold,
        "logprob_threshold": args.logprob_threshold,
        "no_speech_threshold": args.no_speech_threshold,
        "word_timestamps": args.word_timestamps,
    }


def run(args: argparse.Namespace) -> int:
    from whisperkv.batch.inputs import InputError
    from whisperkv.batch.job import run_batch
    from whisperkv.batch.work import JobSpec

    try:
        options = transcribe_options(args)
    except ValueError as err:
        print(f"whisperkv batch: error: {err}", file=sys.stderr)
        return 2
    if os.path.exists(args.output_dir) and not os.path.isdir(args.output_dir):
        print(
            f"whisperkv batch: error: --output_dir {args.output_dir} is a file, not a folder", file=sys.stderr
        )
        return 2
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
    try:
        report = run_batch(args.inputs, spec, model, args.engine, args.workers, args.ray_address, args.verify)
    except InputError as err:
        print(f"whisperkv batch: error: {err}", file=sys.stderr)
        return 2
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
