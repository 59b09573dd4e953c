"""``whisperkv stream [FILE | -]``: print committed text as it becomes final.

A file is decoded once and fed on a simulated, computation-aware clock (``--realtime``: at wall-clock
pace); ``-`` reads raw s16le 16 kHz mono PCM from standard input as it arrives (a microphone piped in).
``--json`` prints one line per partial/commit event and ends with the reuse summary.
"""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(sub) -> None:
    from whisperkv.cli_options import add_parser, language, non_negative_number, positive_number
    from whisperkv.cli_types import probability

    p = add_parser(
        sub, "stream", "live transcription of a file or of raw PCM on stdin, committed text as it is final"
    )
    p.add_argument(
        "audio",
        nargs="?",
        default="-",
        help="audio file, or - (the default) for s16le 16 kHz mono PCM on stdin",
    )
    p.add_argument("--model", default="tiny.en", help="model name or path")
    p.add_argument(
        "--compute_type",
        default="default",
        choices=["default", "float32", "int8", "bfloat16"],
        help="int8 or bfloat16: faster updates, approximations (default: float32 on CPU)",
    )
    p.add_argument(
        "--language",
        type=language,
        default=None,
        help="language code (a multilingual model given none detects it once, on the first update)",
    )
    p.add_argument("--chunk", type=positive_number, default=1.0, help="seconds of new audio between updates")
    p.add_argument("--realtime", action="store_true", help="pace by the wall clock")
    p.add_argument(
        "--simulate_compute",
        type=non_negative_number,
        default=None,
        metavar="SECONDS",
        help="simulated clock: every update costs SECONDS (default: the measured time)",
    )
    p.add_argument(
        "--confident",
        type=probability,
        default=None,
        metavar="P",
        help="also commit a word at its first hearing when its probability (and its punctuation's) is "
        "at least P, it ends "
        "0.1 s before the audio heard, a word after it was heard (0.8 asked where that one reaches "
        "the audio's end) and it does not repeat the word before "
        "it (lower latency; default: only when two updates agree)",
    )
    p.add_argument("--no_vad", action="store_true", help="no voice activity detection: one utterance")
    p.add_argument("--json", action="store_true", help="one JSON line per event, then the reuse summary")


#: what ``whisperkv stream`` says when it would read PCM from a terminal (a person, not a pipe)
NO_INPUT = (
    "no input: give an audio file, or pipe s16le 16 kHz mono PCM into 'whisperkv stream -' "
    "(e.g. ffmpeg -i IN -f s16le -ac 1 -ar 16000 - | whisperkv stream -); standard input is a terminal"
)


def run(args: argparse.Namespace) -> int:
    from whisperkv.load import load_model
    from whisperkv.options_check import OptionError
    from whisperkv.stream.clock import RealtimeClock, SimulatedClock
    from whisperkv.stream.local_decoder import LocalDecoder
    from whisperkv.stream.runner import run_stream
    from whisperkv.stream.session import StreamingSession
    from whisperkv.stream.sources import FileSamples, PCMPipe
    from whisperkv.stream.vad import SpeechDetector

    if args.realtime and args.simulate_compute is not None:
        raise ValueError("--realtime and --simulate_compute exclude each other")
    if args.audio == "-" and sys.stdin.isatty():  # raw PCM cannot be typed: say what is expected, exit 2
        raise OptionError("audio", NO_INPUT)
    clock = RealtimeClock() if args.realtime else SimulatedClock(args.simulate_compute)
    source = PCMPipe(sys.stdin.buffer) if args.audio == "-" else FileSamples(args.audio)
    model = load_model(args.model, compute_type=args.compute_type)
    decoder = LocalDecoder(model, args.language or ("en" if not model.is_multilingual else None))
    session = StreamingSession(
        decoder, vad=None if args.no_vad else SpeechDetector(), confident=args.confident
    )
    for event in run_stream(source, session, clock, args.chunk):
        if args.json and event.type in ("partial", "commit"):
            print(json.dumps(event.as_json()), flush=True)
        elif not args.json and event.type == "commit":
            print(event.text, flush=True)
    if args.json:
        print(json.dumps(session.reuse_summary()), flush=True)
    if source.error:
        print(f"whisperkv: error: {source.error}", file=sys.stderr, flush=True)
        return 1
    return 0
