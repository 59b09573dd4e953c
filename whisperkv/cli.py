"""The whisperkv command line: one parser, ten sub-commands (``COMMANDS``), one line of help each.

``whisperkv FILE...`` (no sub-command) transcribes, like the ``whisper`` command. A bad option value is
one usage line naming the option (exit 2) before any work; a file that fails, for any reason, is one
line on stderr and the others go on (exit 1); a warning is one line. Tracebacks only with ``--debug``
or ``WHISPERKV_DEBUG=1``. The options of ``transcribe`` live in ``cli_options.py``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import traceback
import warnings
from collections.abc import Sequence

from whisperkv.batch import command as batch_command
from whisperkv.boundary import command as boundary_command
from whisperkv.cli_options import (
    CliParser,
    DefaultsFormatter,
    add_debug_arg,
    add_model_args,
    add_parser,
    check_device,
    check_transcribe_args,
    language,
    non_negative_int,
    optional,
    positive_int,
    transcribe_options,
    transcribe_parser,
    unreadable_input,
)
from whisperkv.errors import WhisperKVError
from whisperkv.explain import command as explain_command
from whisperkv.options_check import OptionError, check_transcribe_options
from whisperkv.serve.command import add_serve_parser, cmd_serve
from whisperkv.stream import command as stream_command

#: every sub-command, in the order ``whisperkv --help`` lists them, with its one line there (54 characters
#: at most: one line of an 80-column terminal); a command's own ``--help`` has the longer description
COMMANDS = {
    "transcribe": "transcribe audio files (the default command)",
    "batch": "many files, resumable, on local processes or Ray",
    "stream": "live transcription of a file or of PCM on stdin",
    "serve": "serve the OpenAI audio API over HTTP",
    "explain": "one window's journey through the model, as a web page",
    "verify": "compare the cached decode with the no-cache reference",
    "inspect": "model dimensions, the two caches' shapes and bytes",
    "convert": "write a model as an OpenAI .pt or as safetensors",
    "models": "list the models available offline",
    "encoder-worker": "serve the encoder over HTTP, every answer sealed",
}
DESCRIPTION = "Speech recognition with Whisper: openai-whisper's options and outputs, with two caches."
EPILOG = (
    "'whisperkv FILE...' is short for 'whisperkv transcribe FILE...'. "
    "'whisperkv COMMAND --help' shows the options of a command."
)


def _error(message: str) -> None:
    print(f"whisperkv: error: {message}", file=sys.stderr, flush=True)


def _warn(message: str) -> None:
    print(f"whisperkv: warning: {message}", file=sys.stderr, flush=True)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """warnings.showwarning for the command line: one line, no source path."""
    _warn(str(message))


def _failed(path: str, err: BaseException, debug: bool) -> None:
    """One line for a file that failed; an unexpected error's traceback only with --debug."""
    if isinstance(err, WhisperKVError):
        _error(str(err) if path in str(err) else f"{path}: {err}")
        return
    _error(f"{path}: unexpected {type(err).__name__}: {err}" + ("" if debug else " (--debug shows where)"))
    if debug:
        traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)


def _readable_inputs(paths: Sequence[str]) -> list[str]:
    """The inputs that can be opened; one error line for each other. Checked before the model loads, so
    a misspelt name is said at once rather than seconds later; the other files still go on."""
    readable = []
    for path in paths:
        why = unreadable_input(path)
        if why is None:
            readable.append(path)
        else:
            _error(f"{path}: {why}")
    return readable


def _load(args):
    import torch

    from whisperkv.model import load_model

    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    return load_model(args.model, device=args.device, compute_type=getattr(args, "compute_type", "default"))


def cmd_transcribe(args) -> int:
    from whisperkv.writers import get_writer

    check_transcribe_args(args)
    if args.model_dir:
        warnings.warn("--model_dir is ignored: whisperkv loads local weights only", stacklevel=1)
    if args.max_line_count and not args.max_line_width:
        warnings.warn("--max_line_count has no effect without --max_line_width", stacklevel=1)
    try:
        os.makedirs(args.output_dir, exist_ok=True)
    except OSError as err:
        raise OptionError("output_dir", f"cannot create {args.output_dir}: {err.strerror}") from None
    if args.batched and args.encoder_url:
        raise OptionError("encoder_url", "--batched does not encode through a remote worker yet")
    readable = _readable_inputs(args.audio)
    if not readable:
        return 1
    encoder = boundary_command.remote_encoder(args)
    model = _load(args)
    language = args.language
    if not model.is_multilingual and (language not in (None, "en") or args.task == "translate"):
        warnings.warn(f"{args.model} is an English-only model; transcribing English", stacklevel=1)
        language, args.task = "en", "transcribe"
    options = transcribe_options(args, language)
    check_transcribe_options(model, options)  # token ids against this model's vocabulary
    if encoder is not None:
        options["encoder"] = encoder
    writer = get_writer(args.output_format, args.output_dir)
    writer_options = {
        "highlight_words": args.highlight_words,
        "max_line_width": args.max_line_width,
        "max_line_count": args.max_line_count,
        "max_words_per_line": args.max_words_per_line,
    }
    failures = len(args.audio) - len(readable)
    for path in readable:
        try:
            if args.batched:
                from whisperkv.batched import transcribe_batched

                beam = args.beam_size if args.temperature == 0 else None
                result = transcribe_batched(
                    model, path, batch_size=args.batch_size, **{**options, "beam_size": beam}
                )
            else:
                result = model.transcribe(path, **options)
            if not result["text"].strip():
                notice = "no speech found: the transcript is empty"
                result["warnings"] = [*result.get("warnings", []), notice]
                _warn(f"{path}: {notice}")
            writer(result, path, writer_options)
        except Exception as err:  # one line per failed file; the batch goes on
            failures += 1
            _failed(path, err, args.debug)
    return 1 if failures else 0


def _verify_parser(sub) -> None:
    p = add_parser(sub, "verify", "decode with the cached path and the no-cache reference twin; compare")
    p.add_argument("audio", nargs="+", help="audio file(s) to verify")
    add_model_args(p)
    p.add_argument("--beam_size", type=optional(positive_int), default=None, help="beams (None: greedy)")
    p.add_argument(
        "--language", type=optional(language), default=None, help="language code or name (None: detect)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    boundary_command.add_remote_encoder_args(p)  # adds the path sealed_remote (worker's Cross-KV vs local)


def cmd_verify(args) -> int:
    from whisperkv.verify import verify_file

    check_device(args.device)
    readable = _readable_inputs(args.audio)
    if not readable:
        return 1
    model = _load(args)
    reports, failures = [], len(args.audio) - len(readable)
    for path in readable:
        try:
            report = verify_file(model, path, beam_size=args.beam_size, language=args.language)
            if args.encoder_url:
                from whisperkv.verify import add_remote_path

                encoder = boundary_command.remote_encoder(args)
                add_remote_path(report, model, path, encoder, args.beam_size, args.language)
        except Exception as err:  # one line per failed file; the others are still verified
            failures += 1
            _failed(path, err, args.debug)
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
    p = add_parser(sub, "inspect", "model dimensions and the per-layer shapes and bytes of both caches")
    p.add_argument("--model", default="tiny.en", help="model name, path, or a known size (e.g. large-v3)")
    p.add_argument("--batch", type=positive_int, default=1, help="rows (beams or windows) in the cache")
    p.add_argument(
        "--text-positions",
        dest="text_positions",
        type=non_negative_int,
        default=448,
        help="tokens held in the Self-KV (at most the model's text context)",
    )
    p.add_argument(
        "--audio-positions",
        dest="audio_positions",
        type=optional(positive_int),
        default=None,
        help="encoder positions in the Cross-KV (None: the model's audio context, 1500)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float16", "float32", "bfloat16"],
        help="element type: float32 is what a CPU run uses, float16 what a CUDA run uses",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--boundary", action="store_true", help="bytes that cross per window, every model size")
    add_debug_arg(p)


def cmd_inspect(args) -> int:
    from whisperkv.inspect import inspect_caches, render_inspect

    if args.boundary:
        from whisperkv.boundary.costs import crossing_table, render_crossing_table

        table = crossing_table()
        print(json.dumps(table, indent=2) if args.json else render_crossing_table(table))
        return 0

    report = inspect_caches(args.model, args.batch, args.text_positions, args.dtype, args.audio_positions)
    print(json.dumps(report, indent=2) if args.json else render_inspect(report))
    return 0


def _convert_parser(sub) -> None:
    p = add_parser(sub, "convert", "write a model in another format (OpenAI .pt or transformers safetensors)")
    p.add_argument("source", help="model name or path")
    p.add_argument("destination", help="output .pt file or transformers directory")
    p.add_argument(
        "--format",
        required=True,
        choices=["pt", "safetensors", "transformers"],
        help="format to write (transformers = safetensors: a complete transformers directory)",
    )
    p.add_argument("--dtype", default="float32", choices=["float16", "float32"], help="element type to write")
    add_debug_arg(p)


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
    from whisperkv import __version__

    parser = CliParser(
        prog="whisperkv", description=DESCRIPTION, epilog=EPILOG, formatter_class=_CommandListFormatter
    )
    parser.add_argument("--version", action="version", version=f"whisperkv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    boundary_command.add_remote_encoder_args(transcribe_parser(sub))
    batch_command.add_parser(sub)
    stream_command.add_parser(sub)
    add_serve_parser(sub)
    explain_command.add_parser(sub)
    _verify_parser(sub)
    _inspect_parser(sub)
    _convert_parser(sub)
    add_debug_arg(add_parser(sub, "models", "list models available offline"))
    boundary_command.add_parser(sub)
    _one_line_each(sub)
    return parser


class _CommandListFormatter(argparse.HelpFormatter):
    """The top-level help: the commands listed one per line, without argparse's "COMMAND" line above them
    (whose indent argparse leaves out when it aligns the help column, wrapping the longest name)."""

    def _format_action(self, action: argparse.Action) -> str:
        if isinstance(action, argparse._SubParsersAction):
            return "".join(self._format_action(command) for command in action._get_subactions())
        return super()._format_action(action)


def _one_line_each(sub: argparse._SubParsersAction) -> None:
    """The top-level listing gets each command's short line; each command keeps its full help as its
    description (some parsers are built with a help line only) and shows defaults the same way."""
    for listed in sub._choices_actions:  # argparse's entries of the listing, one per command
        command = sub.choices[listed.dest]
        if command.description is None:
            command.description = listed.help
        command.formatter_class = DefaultsFormatter
        listed.help = COMMANDS[listed.dest]


def _unknown_command(word: str) -> str | None:
    """The error for a first argument that looks like a misspelt command, not a file (None: a file).

    ``whisperkv FILE`` means ``whisperkv transcribe FILE``, so only a word that is not an existing path
    and is close to a command, or has no extension nor folder, is taken for a command."""
    if word.startswith("-") or os.path.exists(word):
        return None
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.6)
    if close:
        return f"unknown command {word!r}: did you mean {close[0]!r}? (and no file of that name exists)"
    if os.sep not in word and "." not in word:
        return f"unknown command {word!r} (and no file of that name exists); commands: {', '.join(COMMANDS)}"
    return None


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit raises no second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no real file (a test's capture): nothing to flush
        pass


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version"):
        unknown = _unknown_command(argv[0])
        if unknown is not None:
            _error(f"{unknown} (see 'whisperkv --help')")
            return 2
        argv = ["transcribe", *argv]  # `whisperkv FILE` works like `whisper FILE`
    args = build_parser().parse_args(argv)
    handler = {
        "transcribe": cmd_transcribe,
        "verify": cmd_verify,
        "inspect": cmd_inspect,
        "convert": cmd_convert,
        "models": cmd_models,
        "batch": batch_command.run,
        "explain": explain_command.run,
        "encoder-worker": boundary_command.run,
        "serve": cmd_serve,
        "stream": stream_command.run,
    }[args.command]
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning  # one line, without the source path; restored on exit
        try:
            return handler(args)
        except OptionError as err:  # a usage error found after parsing: name the option
            name = err.option if err.option == "audio" else f"--{err.option}"
            _error(f"argument {name}: {err.reason} (see 'whisperkv {args.command} --help')")
            return 2
        except BrokenPipeError:  # the reader went away (``... --json | head``): not an error of ours
            _silence_stdout()
            return 141  # 128 + SIGPIPE, what a command killed by the closed pipe reports
        except (WhisperKVError, ValueError, OSError) as err:
            _error(str(err))
            return 2
        except KeyboardInterrupt:
            _error("interrupted")
            return 130
        except Exception as err:  # a bug: one line, the traceback only when asked for
            _failed(f"whisperkv {args.command}", err, getattr(args, "debug", False))
            return 1


if __name__ == "__main__":
    sys.exit(main())
