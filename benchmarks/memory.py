"""Peak memory against the audio's length: a 5-minute file and a 3-hour one, sequential and batched.

    .venv/bin/python benchmarks/memory.py                          # 5 min vs 180 min, batched then sequential
    .venv/bin/python benchmarks/memory.py --long-minutes 20 --modes batched     # a quicker look

The files are built at run time in a temp dir (never committed) by repeating the two long-form recordings
of ../shared/data/speech/long, encoded as 16 kHz mono FLAC. Each run is its own process (one model load,
one transcription); it reports its peak resident set (VmHWM from /proc/self/status) after loading the
model and after transcribing, its wall time, and which reader ``open_source`` chose. The goal (issue 9):
the 3-hour peak within +100 MB of the 5-minute peak, in both modes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SPEECH = ROOT.parent / "shared" / "data" / "speech"
LONG_FILES = ["long/lj001_0001-0032_concat.flac", "long/librivox_sonnets_001-003_concat.flac"]
SAMPLE_RATE = 16000
GOAL_MB = 100


def _status_mb(field: str) -> float:
    """A VmXXX line of /proc/self/status, in MB (no psutil needed)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def worker(args: argparse.Namespace) -> None:
    """One run: load, transcribe, print one JSON line."""
    import torch

    import whisperkv
    from whisperkv import audio_source

    torch.set_num_threads(args.threads)
    if args.in_memory_seconds is not None:
        audio_source.IN_MEMORY_SECONDS = args.in_memory_seconds
    if args.reader_only:
        return reader_worker(args)
    model = whisperkv.load_model("tiny.en", compute_type=args.compute_type)
    loaded = _status_mb("VmHWM")
    reader = type(audio_source.open_source(args.file, model.dims.n_mels)).__name__
    start = time.perf_counter()
    if args.mode == "batched":
        from whisperkv.batched import transcribe_batched

        result = transcribe_batched(model, args.file)
    else:
        result = model.transcribe(args.file, verbose=False)
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "peak_mb": _status_mb("VmHWM"),
                "after_load_mb": loaded,
                "seconds": seconds,
                "segments": len(result["segments"]),
                "words": len(result["text"].split()),
                "reader": reader,
            }
        )
    )


def reader_worker(args: argparse.Namespace) -> None:
    """Only the audio side of a run, without the model: every window read as the mode reads it.

    The sequential loop's reads (samples for the silence check, then the window's frames, 30 s at a time)
    and the batched mode's (its detector over the whole file, then every chunk's window), so what grows
    with the file's length on the audio side shows in minutes rather than the hours a full 3 h run takes.
    """
    from whisperkv.audio import N_FRAMES, pad_or_trim
    from whisperkv.audio_source import open_source
    from whisperkv.batched import chunk_mel, split_at_silences

    loaded = _status_mb("VmHWM")
    start = time.perf_counter()
    source = open_source(args.file, 80)
    windows = 0
    if args.mode == "batched":
        for chunk in split_at_silences(source):
            chunk_mel(source, chunk, 80)
            windows += 1
    else:
        for seek in range(0, source.content_frames, N_FRAMES):
            size = min(N_FRAMES, source.content_frames - seek)
            source.samples(seek * 160, (seek + size) * 160)
            pad_or_trim(source.mel(seek, seek + size), N_FRAMES)
            windows += 1
    seconds = time.perf_counter() - start
    summary = {"peak_mb": _status_mb("VmHWM"), "after_load_mb": loaded, "seconds": seconds}
    print(json.dumps({**summary, "segments": windows, "words": 0, "reader": type(source).__name__}))


def build_file(path: Path, minutes: float) -> Path:
    """``minutes`` of speech: the long-form recordings repeated, written block by block as FLAC."""
    import av

    from whisperkv.audio import load_audio

    base = np.concatenate([load_audio(SPEECH / f) for f in LONG_FILES])
    base = np.round(base * 32767).astype(np.int16)
    total = int(minutes * 60 * SAMPLE_RATE)
    with av.open(str(path), "w", format="flac") as container:
        stream = container.add_stream("flac", rate=SAMPLE_RATE, layout="mono")
        written = 0
        while written < total:
            block = base[: min(len(base), total - written)]
            for at in range(0, len(block), 65536):
                piece = np.ascontiguousarray(block[at : at + 65536]).reshape(1, -1)
                frame = av.AudioFrame.from_ndarray(piece, format="s16", layout="mono")
                frame.sample_rate, frame.time_base = SAMPLE_RATE, Fraction(1, SAMPLE_RATE)
                frame.pts = written + at
                for packet in stream.encode(frame):
                    container.mux(packet)
            written += len(block)
        for packet in stream.encode(None):
            container.mux(packet)
    return path


def run(file: Path, mode: str, args: argparse.Namespace, in_memory_seconds: float | None = None) -> dict:
    command = [sys.executable, __file__, "--worker", str(file), "--mode", mode]
    command += ["--compute_type", args.compute_type, "--threads", str(args.threads)]
    if in_memory_seconds is not None:
        command += ["--in_memory_seconds", str(in_memory_seconds)]
    if args.reader_only:
        command += ["--reader-only"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({mode}, {file.name}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def describe_machine() -> None:
    import av
    import torch

    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"CPU: {cpu} ({os.cpu_count()} cores visible; load average {os.getloadavg()[0]:.1f})")
    versions = f"python {platform.python_version()}, torch {torch.__version__}, av {av.__version__}"
    print(f"{versions}, whisperkv {commit}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--short-minutes", type=float, default=5.0)
    parser.add_argument("--long-minutes", type=float, default=180.0)
    parser.add_argument("--modes", default="batched,sequential", help="comma-separated, run in this order")
    parser.add_argument(
        "--compute_type", default="int8", help="int8 (default: 3 h float32 is slow) or float32"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--also-streamed-short",
        action="store_true",
        help="also run the short file forced through the window-by-window reader",
    )
    parser.add_argument(
        "--reader-only",
        action="store_true",
        help="no model: only read every window as the mode would (the audio side's memory, in minutes)",
    )
    parser.add_argument("--worker", metavar="FILE", help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--in_memory_seconds", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.file = args.worker
        worker(args)
        return

    describe_machine()
    what = "reader only (no model)" if args.reader_only else f"tiny.en {args.compute_type}"
    print(f"{what}, {args.threads} threads; peak = VmHWM of the run's process")
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for label, minutes in (("short", args.short_minutes), ("long", args.long_minutes)):
            started = time.perf_counter()
            files[label] = build_file(Path(tmp) / f"{label}_{minutes:g}min.flac", minutes)
            size = files[label].stat().st_size / 1e6
            print(f"built {minutes:g} min FLAC ({size:.0f} MB) in {time.perf_counter() - started:.0f} s")
        header = f"{'mode':<11}{'audio':>9}{'reader':>16}{'after load MB':>15}{'peak MB':>9}"
        print(f"{header}{'wall s':>8}{'words':>7}")
        for mode in args.modes.split(","):
            results = {}
            runs = [("short", None), ("long", None)]
            if args.also_streamed_short:
                runs.insert(1, ("short", 0.0))
            for label, in_memory in runs:
                result = run(files[label], mode, args, in_memory)
                minutes = args.short_minutes if label == "short" else args.long_minutes
                print(
                    f"{mode:<11}{minutes:>7g} m{result['reader']:>16}{result['after_load_mb']:>15.0f}"
                    f"{result['peak_mb']:>9.0f}{result['seconds']:>8.0f}{result['words']:>7}",
                    flush=True,
                )
                if in_memory is None:
                    results[label] = result
            growth = results["long"]["peak_mb"] - results["short"]["peak_mb"]
            verdict = "met" if growth <= GOAL_MB else "NOT met"
            lengths = f"{args.long_minutes:g} min peak - {args.short_minutes:g} min peak"
            print(f"{mode}: {lengths} = {growth:+.0f} MB (goal <= +{GOAL_MB} MB: {verdict})", flush=True)


if __name__ == "__main__":
    main()
