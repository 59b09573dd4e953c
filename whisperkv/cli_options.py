"""The ``transcribe`` command's options: parsing, help text, and every check that runs before any work.

A bad value is a usage error naming the option (exit 2) before a model loads or a file is read: the
argparse types catch what cannot be parsed, ``whisperkv.options_check`` (shared with the Python API)
catches values out of range, and the checks here catch what only the command line has (the device,
the thread count, the output directory, two inputs that would write the same output files).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

# the argparse types (``cli_types.py``); the other commands' parsers import them from here too
from whisperkv.cli_types import (
    language,
    non_negative_int,
    number,
    optional,
    positive_int,
    positive_number,
    str2bool,
)
from whisperkv.cli_types import non_negative_number as non_negative_number  # for stream/command.py
from whisperkv.options_check import OptionError, check_transcribe_options, fallback_schedule
from whisperkv.tokenizer import LANGUAGES


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line (no usage dump, no list of 200 languages)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"whisperkv: error: {message} (see '{self.prog} --help')\n")


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that adds "(default: X)" only where it says something: not when the help already names its
    default, not for a required option, a switch (``store_true``) or a default of None."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            "default" in text.lower()
            or action.required
            or action.default in (None, argparse.SUPPRESS)
            or action.nargs == 0  # a switch: present or not
            or action.option_strings == []  # a positional argument
        ):
            return action.help
        return f"{text} (default: %(default)s)"


def add_parser(sub, name: str, help: str) -> CliParser:
    """A sub-command parser with a description and the defaults that matter in its ``--help``."""
    return sub.add_parser(name, help=help, description=help, formatter_class=DefaultsFormatter)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny.en", help="model name (tiny.en, base) or path to weights")
    p.add_argument("--model_dir", default=None, help="ignored: whisperkv never downloads")
    p.add_argument("--device", default="cpu", help="torch device to run on (cpu, cuda, cuda:1, mps)")
    p.add_argument(
        "--threads", type=non_negative_int, default=0, help="CPU threads for torch (0: torch's default)"
    )
    add_debug_arg(p)


def add_debug_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--debug",
        action="store_true",
        default=os.environ.get("WHISPERKV_DEBUG", "") not in ("", "0"),
        help="print the traceback of an unexpected error (also: environment WHISPERKV_DEBUG=1)",
    )


# ---------------------------------------------------------------------------------------------------
# the transcribe parser


def transcribe_parser(sub) -> CliParser:
    from whisperkv.writers import SUPPORTED_FORMATS

    p = add_parser(sub, "transcribe", "transcribe audio files (the default command)")
    p.add_argument("audio", nargs="+", help="audio file(s) to transcribe")
    add_model_args(p)
    opt = p.add_argument
    opt("--output_dir", "-o", default=".", help="directory to save the outputs in (created if missing)")
    opt(
        "--output_format",
        "-f",
        default="all",
        choices=[*SUPPORTED_FORMATS, "all"],
        help="all: every format",
    )
    opt(
        "--verbose",
        type=str2bool,
        default=True,
        help="True: print each segment as it is decoded; False: print nothing but warnings and errors",
    )
    add_decoding_args(p)
    opt("--highlight_words", type=str2bool, default=False, help="underline the spoken word in srt/vtt")
    opt(
        "--max_line_width",
        type=optional(positive_int),
        default=None,
        help="characters per subtitle line",
    )
    opt("--max_line_count", type=optional(positive_int), default=None, help="most lines per subtitle (words)")
    opt(
        "--max_words_per_line",
        type=optional(positive_int),
        default=None,
        help="most words per subtitle line (word timestamps; no effect with --max_line_width)",
    )
    opt(
        "--batched",
        type=str2bool,
        default=False,
        help="cut at silences and decode many 30 s chunks as one batch (faster, no previous-text prompt)",
    )
    opt("--batch_size", type=positive_int, default=8, help="chunks per batch with --batched")
    opt(
        "--compute_type",
        default="default",
        choices=["default", "float32", "int8", "bfloat16"],
        help="int8: quantised linear layers; bfloat16: bfloat16 arithmetic (both approximations); "
        "default: float32 on CPU",
    )
    return p


def add_decoding_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The decoding options of ``transcribe()`` (openai-whisper's names and defaults), for every command
    that transcribes: ``transcribe`` and ``batch`` share them, and ``transcribe_options`` reads them.
    Added in openai-whisper's order, which is the order ``--help`` lists them in."""
    _add_search_args(p)
    _add_prompt_args(p)
    _add_fallback_args(p)
    _add_word_args(p)
    return p


def _add_search_args(p: argparse.ArgumentParser) -> None:
    """Task, language, and how tokens are chosen: temperature, sampling, beam search, suppression."""
    opt = p.add_argument
    opt("--task", default="transcribe", choices=["transcribe", "translate"], help="translate: into English")
    opt(
        "--language",
        type=optional(language),
        default=None,
        metavar="LANGUAGE",
        help="language spoken (a code or English name); None: detect it. Codes: " + " ".join(LANGUAGES),
    )
    opt("--temperature", type=number, default=0.0, help="sampling temperature (0: greedy or beam search)")
    opt("--best_of", type=optional(positive_int), default=5, help="candidates sampled at temperature > 0")
    opt("--beam_size", type=optional(positive_int), default=5, help="beams at temperature 0 (None: greedy)")
    opt("--patience", type=optional(number), default=None, help="beam search patience (1.0: conventional)")
    opt(
        "--length_penalty",
        type=optional(number),
        default=None,
        help="alpha of the Google NMT length penalty, 0 to 1 (None: divide the score by the length)",
    )
    opt(
        "--suppress_tokens",
        default="-1",
        help="token ids never emitted (comma-separated); -1: non-speech",
    )


def _add_prompt_args(p: argparse.ArgumentParser) -> None:
    """What each window is prompted with; then ``--fp16``, which openai-whisper lists here."""
    opt = p.add_argument
    opt("--initial_prompt", default=None, help="text the first window is told was said before it")
    opt("--carry_initial_prompt", type=str2bool, default=False, help="give --initial_prompt to every window")
    opt(
        "--hotwords",
        default=None,
        help="words to bias towards, put before the previous text in every prompt (ignored with a prefix)",
    )
    opt(
        "--condition_on_previous_text",
        type=str2bool,
        default=True,
        help="prompt each window with the previous text (False: less looping, less consistency)",
    )
    opt("--fp16", type=str2bool, default=True, help="float16 on CUDA (the CPU always runs float32)")


def _add_fallback_args(p: argparse.ArgumentParser) -> None:
    """When a window is decoded again hotter (the thresholds it must pass), or skipped as silence."""
    opt = p.add_argument
    opt(
        "--temperature_increment_on_fallback",
        type=optional(positive_number),
        default=0.2,
        help="temperature step of retries (up to 1.0) when a window fails a threshold; None: no retry",
    )
    opt(
        "--compression_ratio_threshold",
        type=optional(number),
        default=2.4,
        help="retry when the text's gzip compression ratio is above this (repetitive); None: never",
    )
    opt(
        "--logprob_threshold",
        type=optional(number),
        default=-1.0,
        help="retry when the average log-probability is below this; None: never",
    )
    opt(
        "--no_speech_threshold",
        type=optional(number),
        default=0.6,
        help="skip a window as silence when its no-speech probability is above this (0 to 1) "
        "and its log-probability is below --logprob_threshold",
    )


def _add_word_args(p: argparse.ArgumentParser) -> None:
    """Word timestamps and their punctuation, the clips to transcribe, and the hallucination skip."""
    opt = p.add_argument
    opt("--word_timestamps", type=str2bool, default=False, help="add word-level timestamps (alignment heads)")
    opt(
        "--prepend_punctuations",
        default="\"'“¿([{-",
        help="marks joined to the next word",
    )
    opt(
        "--append_punctuations",
        default="\"'.。,，!！?？:：”)]}、",
        help="with word timestamps: marks joined to the previous word",
    )
    opt(
        "--clip_timestamps",
        default="0",
        help="start,end,start,end,... seconds of the clips to transcribe; a last start runs to the end",
    )
    opt(
        "--hallucination_silence_threshold",
        type=optional(number),
        default=None,
        help="with word timestamps: skip silences longer than this (s) around a likely hallucination",
    )


def temperature_schedule(start: float, increment: float | None) -> tuple[float, ...]:
    """``start``, then ``start + increment``... up to 1.0; a start above 1.0 is tried alone. Its length
    is checked before it is built (``options_check.fallback_schedule``): a tiny step is refused by name."""
    return fallback_schedule(start, increment)


def transcribe_options(args: argparse.Namespace, language_code: str | None) -> dict[str, Any]:
    """The keyword arguments of ``transcribe()`` that these command-line arguments mean."""
    return {
        "verbose": getattr(args, "verbose", None),  # commands without --verbose print no segments
        "task": args.task,
        "language": language_code,
        "temperature": temperature_schedule(args.temperature, args.temperature_increment_on_fallback),
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
    } | ({"hotwords": args.hotwords} if args.hotwords else {})


def check_device(name: str) -> None:
    """Refuse a device this torch cannot run on, before loading anything onto it."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise OptionError("device", f"{name!r} is not a device (cpu, cuda, cuda:N or mps)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise OptionError("device", "CUDA is not available (CPU-only torch or no GPU); use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise OptionError("device", f"there is no {name} ({torch.cuda.device_count()} CUDA devices)")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise OptionError("device", "MPS is not available on this machine; use --device cpu")
    elif device.type != "cpu":
        raise OptionError("device", f"{name!r} is not supported (cpu, cuda, cuda:N or mps)")


def check_outputs(audio: Sequence[str], output_dir: str, output_format: str) -> None:
    """Refuse, before any work, an output directory that is a file and two inputs with one output name."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise OptionError("output_dir", f"{output_dir} exists and is not a directory")
    seen: dict[str, str] = {}
    for path in audio:
        stem = os.path.splitext(os.path.basename(path))[0]
        if stem in seen and seen[stem] != path:
            extension = "*" if output_format == "all" else output_format
            raise OptionError(
                "audio",
                f"{seen[stem]} and {path} would both be written as "
                f"{os.path.join(output_dir, stem)}.{extension}: rename one, or transcribe them into "
                "different --output_dir",
            )
        seen[stem] = path


def unreadable_input(path: str) -> str | None:
    """Why an input file cannot be read (checked before a model loads: seconds, on a busy machine), or
    None. The reasons are the audio reader's own (``whisperkv.audio.decode_audio``)."""
    if not os.path.exists(path):
        return "file not found"
    if os.path.isdir(path):
        return "is a directory, not a file"
    if not os.access(path, os.R_OK):
        return "permission denied"
    return None


def check_transcribe_args(args: argparse.Namespace) -> None:
    """Every check of the transcribe arguments that needs no model; raises ``OptionError``."""
    for flag in ("max_line_count", "max_words_per_line", "highlight_words"):
        if getattr(args, flag) and not args.word_timestamps:
            raise OptionError(flag, "requires --word_timestamps True")
    check_device(args.device)
    check_transcribe_options(None, transcribe_options(args, args.language), temperature=args.temperature)
    check_outputs(args.audio, args.output_dir, args.output_format)
