"""Live transcription against issue 42's goals: WER, commit latency, first commit, compute, punctuation.

    PYTHONPATH=. .venv/bin/python benchmarks/streaming.py                 # both long files + utterances
    PYTHONPATH=. .venv/bin/python benchmarks/streaming.py --seconds 60    # the first minute of each
    PYTHONPATH=. .venv/bin/python benchmarks/streaming.py --naive         # + forced naive reuse

The inputs: both long files of ../shared/data/speech/long/ (references: manifest.tsv's text of the
concatenated clips) and the utterances file (``bench_inputs.build_audio``: the short clips with pauses of
0.3-3 s). Each run is a fresh process (so the first commit is a fresh process's, after the warm-up):
* offline: ``transcribe()`` (greedy, the fallback schedule) on the whole file;
* stream: ``whisperkv stream``'s path — silero VAD, LocalAgreement-2, 1 s chunks, a simulated clock that
  advances by the measured compute (while an update computes for X s, X s more audio arrive, as
  whisper_streaming evaluates); reuse only on exact provenance;
* naive (``--naive``): the same, but every other update reuses the previous update's encoder output and
  Cross-KV for the grown buffer without a check (``decode_window(..., force_reuse=True)``), as a
  skip-encode optimisation would; each such update is decoded again on the valid path to count how many
  changed the text.
Latency is per committed word: stream time at the commit minus the word's end. The first commit is
judged against the end of its utterance (the VAD's). "cased" is a case- and punctuation-sensitive WER of
the committed text against offline ``transcribe()``'s (``cased_wer``). Timings on a shared machine are
noisy: the load average is printed with them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import jiwer
import numpy as np

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech"
SR = 16000
#: whisper_streaming's published mean latency (LocalAgreement-2; Macháček et al. 2023, large-v2 on a GPU)
ANCHOR_LATENCY_S = 3.3
GOALS = {"wer_points": 1.0, "mean": 1.0, "p95": 2.0, "first": 1.5, "compute": 0.25}


def cased_wer(offline: str, committed: str) -> tuple[int, int]:
    """(errors, offline words) of ``committed`` against ``offline`` on the words as written: no
    normaliser, so case and punctuation count ("Americans. Ask" against "Americans, ask": 2 errors)."""
    if not offline.split():
        return len(committed.split()), 0
    found = jiwer.process_words(offline, committed)
    return found.substitutions + found.deletions + found.insertions, len(offline.split())


def inputs(seconds: float | None) -> dict[str, tuple[np.ndarray, str]]:
    """name → (16 kHz audio, reference text): both long files, then the utterances file."""
    from bench_inputs import build_audio

    from whisperkv.audio import load_audio

    found = {}
    for row in csv.DictReader(open(SPEECH / "manifest.tsv", encoding="utf-8"), delimiter="\t"):
        if row["file"].startswith("long/"):
            found[Path(row["file"]).name] = (load_audio(SPEECH / row["file"]), row["reference"])
    audios, refs = build_audio(min_long_seconds=0)
    found["utterances"] = (audios["utterances"], refs["utterances"])
    if seconds:  # a cut file has no reference text: offline transcribe() of the cut stands in (parent)
        found = {k: (a[: int(seconds * SR)], "") for k, (a, _) in found.items()}
    return found


class ArraySource:
    def __init__(self, audio: np.ndarray) -> None:
        self.audio, self.position = audio, 0

    def read(self, n: int) -> np.ndarray:
        out = self.audio[self.position : self.position + n]
        self.position += len(out)
        return out


def stream_run(
    model,
    audio: np.ndarray,
    chunk: float,
    naive: bool,
    fixed_cost: float | None,
    confident: float | None = None,
    vad: bool = True,
) -> dict:
    """One stream of ``audio``: its text, compute, per-word latencies, first commit, reuse."""
    from whisperkv.stream.clock import SimulatedClock
    from whisperkv.stream.local_decoder import LocalDecoder
    from whisperkv.stream.runner import run_stream
    from whisperkv.stream.session import StreamingSession
    from whisperkv.stream.vad import SpeechDetector

    decoder = LocalDecoder(model, naive_reuse=naive)
    decoder.record = [] if naive else None
    session = StreamingSession(decoder, vad=SpeechDetector() if vad else None, confident=confident)
    clock = SimulatedClock(fixed_cost)
    latencies, first, first_end = [], None, None
    for event in run_stream(ArraySource(audio), session, clock, chunk):
        if event.type == "commit":
            latencies += [event.audio_time - w.end for w in event.words]
            if first is None:
                first = {"at": event.audio_time, "word_end": event.words[-1].end}
        elif event.type == "utterance_end" and first is not None and first_end is None:
            first_end = event.end  # the end of the first commit's utterance
    if first is not None:
        first["utterance_end"] = first_end if first_end is not None else len(audio) / SR
    run = {
        "text": session.committed_text(),
        "compute": clock.compute,
        "latencies": latencies,
        "first": first,
        "updates": decoder.updates,
        "encodes": decoder.encodes,
        "reuse": decoder.reuse_summary(),
    }
    if naive:
        run["differ"], run["stale"] = differing_updates(model, decoder.record)
    return run


def differing_updates(model, record: list[dict]) -> tuple[int, int]:
    """(stale updates whose text differs from the valid decode of the same inputs, stale updates)."""
    from whisperkv.stream.local_decoder import LocalDecoder

    stale = [r for r in record if r["stale"]]
    differ = sum(
        LocalDecoder(model).decode(r["audio"], r["start"], r["prompt"]).text != r["text"] for r in stale
    )
    return differ, len(stale)


def child(args: argparse.Namespace) -> int:
    """One run in this (fresh) process; its result as one JSON line."""
    import whisperkv

    audio, _ = inputs(args.seconds)[args.child_input]
    model = whisperkv.load_model(args.model, compute_type=args.compute_type)
    if args.child == "offline":
        t0 = time.perf_counter()
        run = {"text": model.transcribe(audio)["text"], "compute": time.perf_counter() - t0}
    else:
        run = stream_run(
            model, audio, args.chunk, args.child == "naive", args.simulate_compute, args.confident
        )
    run["load_average"] = os.getloadavg()[0]
    print(json.dumps(run))
    return 0


def in_own_process(args: argparse.Namespace, kind: str, name: str) -> dict:
    argv = [sys.executable, __file__, "--child", kind, "--child_input", name, "--model", args.model]
    argv += ["--chunk", str(args.chunk), "--compute_type", args.compute_type]
    if args.seconds:
        argv += ["--seconds", str(args.seconds)]
    if args.simulate_compute is not None:
        argv += ["--simulate_compute", str(args.simulate_compute)]
    if args.confident is not None:
        argv += ["--confident", str(args.confident)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} run of {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def p95(values: list[float]) -> float:
    return float(np.percentile(values, 95)) if values else float("nan")


def machine() -> str:
    import torch

    cpu = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"CPU: {cpu}; {os.cpu_count()} cores, torch threads {torch.get_num_threads()}; load average {load}\n"
        f"python {platform.python_version()}, torch {torch.__version__}, whisperkv {commit.strip()}"
    )


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def file_row(name: str, reference: str, duration: float, offline: dict, run: dict) -> dict:
    """One file's figures, and each goal's verdict."""
    from whisperkv.metrics import word_errors

    reference = reference or offline["text"]
    s_err, s_words = word_errors(reference, run["text"])
    o_err, o_words = word_errors(reference, offline["text"])
    c_err, c_words = cased_wer(offline["text"].strip(), run["text"].strip())
    lat, first = run["latencies"], run["first"]
    after_end = first["at"] - first["utterance_end"] if first else float("nan")
    row = {
        "name": name,
        "wer": s_err / max(s_words, 1),
        "offline_wer": o_err / max(o_words, 1),
        "cased": c_err / max(c_words, 1),
        "mean": statistics.mean(lat) if lat else float("nan"),
        "p95": p95(lat),
        "first_after_end": after_end,
        "first_latency": first["at"] - first["word_end"] if first else float("nan"),
        "compute": run["compute"] / duration,
        "offline_compute": offline["compute"] / duration,
        "encodes": f"{run['encodes']}/{run['updates']}",
    }
    row["goals"] = {
        "WER within 1 pt of offline": row["wer"] <= row["offline_wer"] + GOALS["wer_points"] / 100,
        "mean latency <= 1.0 s": row["mean"] <= GOALS["mean"],
        "p95 latency <= 2.0 s": row["p95"] <= GOALS["p95"],
        "first commit <= 1.5 s after its utterance's end": after_end <= GOALS["first"],
        "compute <= 0.25 s per s of audio": row["compute"] <= GOALS["compute"],
    }
    return row


def print_rows(rows: list[dict], latencies: list[float]) -> None:
    header = (
        f"{'file':<34} {'WER':>6} {'offline':>7} {'cased':>6} {'lat mean':>8} {'lat p95':>7} "
        f"{'1st-end':>7} {'1st lat':>7} {'comp/s':>6} {'enc/upd':>9}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in rows:
        print(
            f"{r['name'][:34]:<34} {r['wer']:>6.1%} {r['offline_wer']:>7.1%} {r['cased']:>6.1%} "
            f"{r['mean']:>8.2f} {r['p95']:>7.2f} {r['first_after_end']:>7.2f} {r['first_latency']:>7.2f} "
            f"{r['compute']:>6.3f} {r['encodes']:>9}"
        )
    print("\ngoals (issue 42; per file):")
    for r in rows:
        for goal, met in r["goals"].items():
            print(f"  {verdict(met):<8} {r['name'][:34]:<34} {goal}")
    mean = statistics.mean(latencies) if latencies else float("nan")
    everything = all(all(r["goals"].values()) for r in rows)
    print(
        f"\nanchor: whisper_streaming (LocalAgreement-2) published a mean latency of {ANCHOR_LATENCY_S} s; "
        f"this run {mean:.2f} s over every committed word (p95 {p95(latencies):.2f} s)"
    )
    print(f"all goals: {verdict(everything)}")


def main() -> int:
    from whisperkv.cli_types import probability

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--chunk", type=float, default=1.0)
    p.add_argument("--compute_type", default="default", help="the model's (int8, bfloat16: approximations)")
    p.add_argument("--seconds", type=float, default=None, help="only the first SECONDS of each file")
    p.add_argument("--files", default=None, help="comma-separated names (default: every input)")
    p.add_argument(
        "--simulate_compute",
        type=float,
        default=None,
        metavar="SECONDS",
        help="clock cost per update instead of the measured time (policy tuning on a busy machine)",
    )
    p.add_argument("--naive", action="store_true", help="also run the naive-reuse path")
    p.add_argument(
        "--confident",
        type=probability,
        default=None,
        metavar="P",
        help="also commit a word at its first hearing at probability >= P (whisperkv stream --confident)",
    )
    p.add_argument("--child", choices=("offline", "stream", "naive"), help=argparse.SUPPRESS)
    p.add_argument("--child_input", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    if not (SPEECH / "manifest.tsv").is_file():
        print(f"no speech set at {SPEECH}", file=sys.stderr)
        return 2
    print(machine(), flush=True)
    clock = "measured compute" if args.simulate_compute is None else f"{args.simulate_compute:g} s per update"
    ref = "offline transcribe() (cut files)" if args.seconds else "the manifest's references"
    kind = "" if args.compute_type == "default" else f" {args.compute_type}"
    policy = "LocalAgreement-2" + (f", confident >= {args.confident:g}" if args.confident else "")
    print(f"{args.model}{kind}, {args.chunk:g} s chunks, {policy}; clock: {clock}", flush=True)
    print(f"WER against {ref}", flush=True)
    files = inputs(args.seconds)
    wanted = args.files.split(",") if args.files else list(files)
    rows, latencies = [], []
    try:
        for name in wanted:
            audio, reference = files[name]
            offline = in_own_process(args, "offline", name)
            run = in_own_process(args, "stream", name)
            rows.append(file_row(name, reference, len(audio) / SR, offline, run))
            latencies += run["latencies"]
            r = rows[-1]
            print(
                f"{name}: stream WER {r['wer']:.1%} (offline {r['offline_wer']:.1%}), latency mean "
                f"{r['mean']:.2f} s p95 {r['p95']:.2f} s, compute {r['compute']:.3f} s/s (load average "
                f"{run['load_average']:.1f}); reuse {json.dumps(run['reuse'])}",
                flush=True,
            )
            if args.naive:
                naive = in_own_process(args, "naive", name)
                per_s = naive["compute"] / (len(audio) / SR)
                print(
                    f"  naive: {naive['stale']} of {naive['updates']} updates reused a stale encoder output; "
                    f"{naive['differ']} of them changed the text; compute {per_s:.3f} s/s "
                    f"(valid {r['compute']:.3f})",
                    flush=True,
                )
    except KeyboardInterrupt:
        print("\n(interrupted: the summary covers only what was measured above)", flush=True)
    print_rows(rows, latencies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
