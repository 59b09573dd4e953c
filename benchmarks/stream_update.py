"""Where a live stream's update goes: wall ms per update of each part, this checkout against another.

    PYTHONPATH=. .venv/bin/python benchmarks/stream_update.py --compute_type int8
    PYTHONPATH=. .venv/bin/python benchmarks/stream_update.py --before /tmp/old --rounds 5

One of ``../shared``'s long files (``--input``, its first ``--seconds``) is streamed as ``whisperkv
stream`` does (1 s chunks, the VAD, ``--confident``) on the simulated clock (``--cost`` s an update), so
every run takes the same decisions and decodes the same buffers; only the wall time of each part moves.
Each run is its own process; with ``--before DIR`` (a worktree of an older commit) its runs alternate
with this checkout's, round by round, so both see the same machine. Printed per checkout: the medians
over the rounds of ms per update of the whole decode and of its parts (the encoder, the Cross-KV
projection, the greedy decode with its prompt, the word alignment and within it the median filter, the
log-Mel), the VAD's ms per update, and whether the committed words are the same in every run. The parts
are timed by wrapping the functions that do them, so the figures hold their Python calls too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternate import StepTimer  # noqa: E402
from provenance import describe  # noqa: E402

#: (label, module, attribute path): the functions each part is timed through
PARTS = (
    ("decode (whole)", "whisperkv.stream.local_decoder", "LocalDecoder.decode"),
    ("  encoder", "whisperkv.model.whisper", "Whisper.embed_audio"),
    ("  Cross-KV", "whisperkv.model.decoder", "TextDecoder.project_cross_kv"),
    ("  greedy decode", "whisperkv.stream.local_decoder", "decode_greedy"),
    ("  alignment", "whisperkv.stream.update_state", "add_word_timestamps"),
    ("    median filter", "whisperkv.timing", "median_filter"),
    ("  log-Mel", "whisperkv.stream.update_state", "UpdateWindow.__init__"),
    ("VAD", "whisperkv.stream.vad", "SpeechDetector.process"),
)


def locate(module_name: str, path: str) -> tuple[object, str] | None:
    """(the object holding the function, its name) for ``PARTS``' module and attribute path, or None."""
    import importlib

    owner: object | None = importlib.import_module(module_name)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part, None)
    return None if owner is None or getattr(owner, name, None) is None else (owner, name)


def wrap_parts() -> dict[str, StepTimer]:
    """A timer on every part of ``PARTS`` this checkout has (a part it lacks is left out of its table)."""
    timers: dict[str, StepTimer] = {}
    for label, module_name, path in PARTS:
        found = locate(module_name, path)
        if found is not None:
            owner, name = found
            timers[label] = StepTimer()
            setattr(owner, name, timers[label].wrap(getattr(owner, name)))
    return timers


def child(args: argparse.Namespace) -> dict:
    """One run in this process: ms per update of each part, and a digest of the committed words."""
    import torch

    torch.set_num_threads(args.threads)
    from streaming import SPEECH, ArraySource

    import whisperkv
    from whisperkv.audio import load_audio
    from whisperkv.stream.clock import SimulatedClock
    from whisperkv.stream.local_decoder import LocalDecoder
    from whisperkv.stream.runner import run_stream
    from whisperkv.stream.session import StreamingSession
    from whisperkv.stream.vad import SpeechDetector

    audio = load_audio(SPEECH / "long" / args.input)[: int(args.seconds * 16000)]
    model = whisperkv.load_model(args.model, compute_type=args.compute_type)
    timers = wrap_parts()
    session = StreamingSession(LocalDecoder(model), vad=SpeechDetector(), confident=args.confident)
    session.warm()
    for timer in timers.values():
        timer.reset()
    for _ in run_stream(ArraySource(audio), session, SimulatedClock(args.cost), 1.0):
        pass
    text = session.committed_text()
    per_update = {label: timer.seconds / session.decodes * 1e3 for label, timer in timers.items()}
    return {
        "ms": per_update,
        "decodes": session.decodes,
        "words": hashlib.sha256(text.encode()).hexdigest()[:12],
    }


def run_in(repo: Path, args: argparse.Namespace) -> dict:
    argv = [sys.executable, __file__, "--child", "--input", args.input, "--seconds", str(args.seconds)]
    argv += ["--model", args.model, "--compute_type", args.compute_type, "--cost", str(args.cost)]
    argv += ["--confident", str(args.confident), "--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    done = subprocess.run(argv, env=env, cwd=repo, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"a run in {repo} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(name: str, runs: list[dict]) -> None:
    labels = list(runs[0]["ms"])
    print(
        f"\n{name}: {runs[0]['decodes']} updates a run; committed words {sorted({r['words'] for r in runs})}"
    )
    for label in labels:
        values = [r["ms"][label] for r in runs]
        each = ", ".join(f"{v:.1f}" for v in values)
        print(f"  {label:<20} {statistics.median(values):8.1f} ms/update   runs: {each}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", default="lj001_0001-0032_concat.flac", help="a file of ../shared's long/")
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--compute_type", default="int8")
    p.add_argument("--cost", type=float, default=0.3, help="the simulated clock's seconds an update")
    p.add_argument("--confident", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--before", type=Path, default=None, metavar="DIR", help="another checkout, alternated")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    print(describe(args.threads))
    what = f"{args.input}, first {args.seconds:g} s; simulated {args.cost} s an update"
    print(f"{args.model} {args.compute_type}; {what}")
    here = Path(__file__).resolve().parents[1]
    checkouts = {"this checkout": here} | ({f"before ({args.before})": args.before} if args.before else {})
    runs: dict[str, list[dict]] = {name: [] for name in checkouts}
    for round_ in range(args.rounds):
        order = list(checkouts.items()) if round_ % 2 == 0 else list(checkouts.items())[::-1]
        for name, repo in order:
            runs[name].append(run_in(repo, args))
    for name, found in runs.items():
        report(name, found)
    if args.before:
        mine, theirs = runs["this checkout"], runs[f"before ({args.before})"]
        whole = "decode (whole)"
        ratio = statistics.median(r["ms"][whole] for r in mine) / statistics.median(
            r["ms"][whole] for r in theirs
        )
        same = {r["words"] for r in mine} == {r["words"] for r in theirs}
        print(f"\nwhole decode, this checkout / before: {ratio:.3f}; the same committed words: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
