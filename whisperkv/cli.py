"""The whisperkv command line: one parser, ten sub-commands (``COMMANDS``, ``cli_parser.py``), one line of
help each; here, running them.

``whisperkv FILE...`` (no sub-command) transcribes, like the ``whisper`` command. A bad option value is
one usage line naming the option (exit 2) before any work; a file that fails, for any reason, is one
line on stderr and the others go on (exit 1); a warning is one line. Tracebacks only with ``--debug``
or ``WHISPERKV_DEBUG=1``. The options of ``transcribe`` live in ``cli_options.py``.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
import traceback
import warnings
from collections.abc import Sequence

from whisperkv.batch import command as batch_command
from whisperkv.boundary import command as boundary_command
from whisperkv.cli_options import check_device, check_transcribe_args, transcribe_options, unreadable_input
from whisperkv.cli_parser import COMMANDS, build_parser
from whisperkv.errors import WhisperKVError
from whisperkv.explain import command as explain_command
from whisperkv.options_check import OptionError, check_transcribe_options
from whisperkv.serve.command import cmd_serve
from whisperkv.stream import command as stream_command


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

    from whisperkv.load import load_model

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


def cmd_encoder_worker(args) -> int:
    """The worker loads its model as every command here does: through ``_load``."""
    return boundary_command.run(args, _load)


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
        "encoder-worker": cmd_encoder_worker,
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
