"""The whisperkv command line's parser: the sub-commands (``COMMANDS``), in the order ``whisperkv --help``
lists them with one line each, and the options of the commands that have no module of their own
(``verify``, ``inspect``, ``convert``, ``models``). Running a command is ``cli.py``'s.
"""

from __future__ import annotations

import argparse

from whisperkv.batch import command as batch_command
from whisperkv.boundary import command as boundary_command
from whisperkv.cli_options import (
    CliParser,
    DefaultsFormatter,
    add_debug_arg,
    add_model_args,
    add_parser,
    language,
    non_negative_int,
    optional,
    positive_int,
    transcribe_parser,
)
from whisperkv.explain import command as explain_command
from whisperkv.serve.command import add_serve_parser
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
