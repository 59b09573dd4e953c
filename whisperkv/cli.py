"""The ``whisperkv`` command: transcribe, verify, inspect, convert, models.

``whisperkv FILE...`` (no sub-command) transcribes, like the ``whisper`` command. Every deliberate
error (bad audio, bad model path, bad option) becomes one line on stderr and a non-zero exit; in a
batch, one bad file does not stop the others.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence

from whisperkv.errors import WhisperKVError
from whisperkv.serve.command import add_serve_parser, cmd_serve
from whisperkv.stream import command as stream_command

COMMANDS = ("transcribe", "verify", "inspect", "convert", "models", "serve", "stream")


def _str2bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


def _optional(kind):
    def parse(value: str):
        return None if value.strip().lower() == "none" else kind(value)

    return parse


def _error(message: str) -> None:
    print(f"whisperkv: error: {message}", file=sys.stderr, flush=True)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny.en", help="model name (tiny.en, base) or path (default: tiny.en)")
    p.add_argument("--model_dir", default=None, help="ignored: whisperkv never downloads")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: torch's default)")


def _transcribe_parser(sub) -> None:
    from whisperkv.tokenizer import LANGUAGES, TO_LANGUAGE_CODE
    from whisperkv.writers import SUPPORTED_FORMATS

    p = sub.add_parser("transcribe", help="transcribe audio files (the default command)")
    p.add_argument("audio", nargs="+", help="audio file(s) to transcribe")
    _add_model_args(p)
    p.add_argument("--output_dir", "-o", default=".", help="directory to save the outputs")
    p.add_argument("--output_format", "-f", default="all", choices=[*SUPPORTED_FORMATS, "all"])
    p.add_argument("--verbose", type=_str2bool, default=True, help="print progress and segments")
    p.add_argument("--task", default="transcribe", choices=["transcribe", "translate"])
    languages = sorted(LANGUAGES) + sorted(k.title() for k in TO_LANGUAGE_CODE)
    p.add_argument("--language", default=None, choices=languages, metavar="LANGUAGE")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--best_of", type=_optional(int), default=5)
    p.add_argument("--beam_size", type=_optional(int), default=5)
    p.add_argument("--patience", type=float, default=None)
    p.add_argument("--length_penalty", type=float, default=None)
    p.add_argument("--suppress_tokens", type=str, default="-1")
    p.add_argument("--initial_prompt", type=str, default=None)
    p.add_argument("--carry_initial_prompt", type=_str2bool, default=False)
    p.add_argument("--condition_on_previous_text", type=_str2bool, default=True)
    p.add_argument("--fp16", type=_str2bool, default=True, help="float16 on CUDA (CPU always float32)")
    p.add_argument("--temperature_increment_on_fallback", type=_optional(float), default=0.2)
    p.add_argument("--compression_ratio_threshold", type=_optional(float), default=2.4)
    p.add_argument("--logprob_threshold", type=_optional(float), default=-1.0)
    p.add_argument("--no_speech_threshold", type=_optional(float), default=0.6)
    p.add_argument("--word_timestamps", type=_str2bool, default=False)
    p.add_argument("--prepend_punctuations", type=str, default="\"'“¿([{-")
    p.add_argument("--append_punctuations", type=str, default="\"'.。,，!！?？:：”)]}、")
    p.add_argument("--highlight_words", type=_str2bool, default=False)
    p.add_argument("--max_line_width", type=_optional(int), default=None)
    p.add_argument("--max_line_count", type=_optional(int), default=None)
    p.add_argument("--max_words_per_line", type=_optional(int), default=None)
    p.add_argument("--clip_timestamps", type=str, default="0")
    p.add_argument("--hallucination_silence_threshold", type=_optional(float), default=None)
    p.add_argument(
        "--batched",
        type=_str2bool,
        default=False,
        help="cut at silences and decode many 30 s chunks as one batch (faster, no previous-text prompt)",
    )
    p.add_argument("--batch_size", type=positive_int, default=8, help="chunks per batch with --batched")
    p.add_argument("--compute_type", default="default", choices=["default", "float32", "int8"])


def _temperatures(start: float, increment: float | None) -> tuple[float, ...] | float:
    if increment is None:
        return start
    values, t = [], start
    while t <= 1.0 + 1e-6:
        values.append(round(t, 10))
        t += increment
    return tuple(values)


def _load(args):
    import torch

    from whisperkv.model import load_model

    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    return load_model(args.model, device=args.device, compute_type=getattr(args, "compute_type", "default"))


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1 (a bad value is a one-line usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def cmd_transcribe(args) -> int:
    from whisperkv.tokenizer import TO_LANGUAGE_CODE
    from whisperkv.writers import get_writer

    if args.model_dir:
        warnings.warn("--model_dir is ignored: whisperkv loads local weights only", stacklevel=1)
    for flag in ("max_line_count", "max_words_per_line", "highlight_words"):
        if getattr(args, flag) and not args.word_timestamps:
            _error(f"--{flag} requires --word_timestamps True")
            return 2
    if args.max_line_count and not args.max_line_width:
        warnings.warn("--max_line_count has no effect without --max_line_width", stacklevel=1)
    model = _load(args)
    language = args.language
    if language is not None and language.lower() in TO_LANGUAGE_CODE:
        language = TO_LANGUAGE_CODE[language.lower()]
    if not model.is_multilingual and (language not in (None, "en") or args.task == "translate"):
        warnings.warn(f"{args.model} is an English-only model; transcribing English", stacklevel=1)
        language, args.task = "en", "transcribe"
    os.makedirs(args.output_dir, exist_ok=True)
    writer = get_writer(args.output_format, args.output_dir)
    writer_options = {
        "highlight_words": args.highlight_words,
        "max_line_width": args.max_line_width,
        "max_line_count": args.max_line_count,
        "max_words_per_line": args.max_words_per_line,
    }
    options = {
        "verbose": args.verbose,
        "task": args.task,
        "language": language,
        "temperature": _temperatures(args.temperature, args.temperature_increment_on_fallback),
        "best_of": args.best_of,
        "beam_size": args.beam_size,
        "patience": args.patience,
        "length_penalty": args.length_penalty,
        "suppress_tokens": args.suppress_tokens,
        "initial_prompt": args.initial_prompt,
        "carry_initial_prompt": args.carry_initial_prompt,
        "condition_on_previous_text": args.condition_on_previous_text,
        "compression_ratio_threshold": args.compression_ratio_threshold,
        "logprob_threshold": args.logprob_threshold,
        "no_speech_threshold": args.no_speech_threshold,
        "word_timestamps": args.word_timestamps,
        "prepend_punctuations": args.prepend_punctuations,
        "append_punctuations": args.append_punctuations,
        "clip_timestamps": args.clip_timestamps,
        "hallucination_silence_threshold": args.hallucination_silence_threshold,
    }
    failures = 0
    for path in args.audio:
        try:
            if args.batched:
                from whisperkv.batched import transcribe_batched

                beam = args.beam_size if args.temperature == 0 else None
                result = transcribe_batched(
                    model, path, batch_size=args.batch_size, **{**options, "beam_size": beam}
                )
            else:
                result = model.transcribe(path, **options)
            writer(result, path, writer_options)
        except WhisperKVError as err:
            failures += 1
            _error(str(err) if path in str(err) else f"{path}: {err}")
            continue
        if not args.verbose:
            print(result["text"].strip(), flush=True)
    return 1 if failures else 0


def _verify_parser(sub) -> None:
    p = sub.add_parser("verify", help="decode with the cached path and the no-cache reference twin; compare")
    p.add_argument("audio", nargs="+")
    _add_model_args(p)
    p.add_argument("--beam_size", type=_optional(int), default=None)
    p.add_argument("--language", default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def cmd_verify(args) -> int:
    from whisperkv.verify import verify_file

    model = _load(args)
    reports, failures = [], 0
    for path in args.audio:
        try:
            report = verify_file(model, path, beam_size=args.beam_size, language=args.language)
        except WhisperKVError as err:
            failures += 1
            _error(str(err))
            continue
        reports.append(report)
        if not args.json:
            print(f"{path}: {'IDENTICAL' if report['identical'] else 'DIVERGED'}")
            for name, path_report in report["paths"].items():
                verdict = "identical" if path_report["identical"] else "DIVERGED"
                print(
                    f"  {name:<28} {verdict:<10} tokens={path_report['tokens']:<4} "
                    f"max|Δlogit|={path_report['max_abs_logit_diff']:.3g}  {path_report.get('detail', '')}"
                )
    if args.json:
        out = (
            reports[0]
            if len(reports) == 1
            else {"identical": all(r["identical"] for r in reports), "files": reports}
        )
        print(json.dumps(out, indent=2))
    diverged = any(not r["identical"] for r in reports)
    return 1 if (diverged or failures) else 0


def _inspect_parser(sub) -> None:
    p = sub.add_parser("inspect", help="model dimensions and the per-layer shapes and bytes of both caches")
    p.add_argument("--model", default="tiny.en", help="model name, path, or a known size (e.g. large-v3)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--text-positions", dest="text_positions", type=int, default=448)
    p.add_argument("--audio-positions", dest="audio_positions", type=int, default=None)
    p.add_argument("--dtype", default="float16", choices=["float16", "float32", "bfloat16"])
    p.add_argument("--json", action="store_true")


def cmd_inspect(args) -> int:
    from whisperkv.inspect import inspect_caches, render_inspect

    report = inspect_caches(args.model, args.batch, args.text_positions, args.dtype, args.audio_positions)
    print(json.dumps(report, indent=2) if args.json else render_inspect(report))
    return 0


def _convert_parser(sub) -> None:
    p = sub.add_parser(
        "convert", help="write a model in another format (OpenAI .pt or transformers safetensors)"
    )
    p.add_argument("source", help="model name or path")
    p.add_argument("destination", help="output .pt file or transformers directory")
    p.add_argument("--format", required=True, choices=["pt", "safetensors"])
    p.add_argument("--dtype", default="float32", choices=["float16", "float32"])


def cmd_convert(args) -> int:
    from whisperkv.weights.convert import convert

    out = convert(args.source, args.destination, args.format, args.dtype)
    print(out)
    return 0


def cmd_models(args) -> int:
    from whisperkv.weights import available_models

    for name in available_models():
        print(name)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="whisperkv", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _transcribe_parser(sub)
    _verify_parser(sub)
    _inspect_parser(sub)
    _convert_parser(sub)
    sub.add_parser("models", help="list models available offline")
    add_serve_parser(sub)
    stream_command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["transcribe", *argv]  # `whisperkv FILE` works like `whisper FILE`
    args = build_parser().parse_args(argv)
    handler = {
        "transcribe": cmd_transcribe,
        "verify": cmd_verify,
        "inspect": cmd_inspect,
        "convert": cmd_convert,
        "models": cmd_models,
        "serve": cmd_serve,
        "stream": stream_command.run,
    }[args.command]
    try:
        return handler(args)
    except WhisperKVError as err:
        _error(str(err))
        return 2
    except (ValueError, OSError) as err:
        _error(str(err))
        return 2
    except KeyboardInterrupt:
        _error("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
