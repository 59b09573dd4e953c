"""Live transcription's words at every simulated compute time (issue 42's sweep): a slow machine may lag,
never lose words.

    PYTHONPATH=. .venv/bin/python benchmarks/streaming_sweep.py --compute_type int8 --confident 0.5
    PYTHONPATH=. .venv/bin/python benchmarks/streaming_sweep.py --computes 1.5 --no_clips   # one column
    PYTHONPATH=. .venv/bin/python benchmarks/streaming_sweep.py --only clips,jfk   # some inputs
    PYTHONPATH=. .venv/bin/python benchmarks/streaming_sweep.py --vad on   # the VAD's rows only

Each input is streamed as ``whisperkv stream`` does (1 s chunks, LocalAgreement-2), on a clock that
charges every update a fixed compute time (0.1 to 5 s: at 1.5 s per 1 s chunk the stream falls behind
and each update hears 1.5 s of new audio), with the VAD and without it. The inputs: both long files, the
utterances file (``streaming.py``'s three) and the English clips of ``manifest.tsv`` as one corpus. Each
is judged against the references: the committed text's WER within 1 point of offline ``transcribe()``'s
(greedy, the fallback schedule) at every compute time; on jfk, no word of the offline transcript
missing. Only words are measured here (the clock is simulated, so the figures do not depend on the
machine's load); latencies are ``streaming.py``'s.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time

import jiwer
from streaming import SPEECH, inputs, machine, stream_run

COMPUTES = (0.1, 0.5, 1.5, 3.0, 5.0)
#: the committed text's WER may exceed offline's by this much (points)
WER_POINTS = 1.0


def clips() -> dict[str, tuple]:
    """The English clips of the manifest: name → (audio, reference)."""
    from whisperkv.audio import load_audio

    rows = csv.DictReader(open(SPEECH / "manifest.tsv", encoding="utf-8"), delimiter="\t")
    return {
        r["id"]: (load_audio(SPEECH / r["file"]), r["reference"])
        for r in rows
        if r["file"].startswith("en/") and r["language"] == "en"
    }


def corpus_errors(pairs: list[tuple[str, str]]) -> tuple[int, int]:
    """(word edits, reference words) summed over (reference, hypothesis) pairs (``word_errors``)."""
    from whisperkv.metrics import word_errors

    counts = [word_errors(reference, hypothesis) for reference, hypothesis in pairs]
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


def missing(pairs: list[tuple[str, str]]) -> int:
    """Words of each reference the hypothesis lacks (deletions), normalised, summed."""
    from whisperkv.metrics import normalize_text

    return sum(jiwer.process_words(normalize_text(r), normalize_text(h)).deletions for r, h in pairs)


def sweep(model, groups: dict[str, dict], args: argparse.Namespace) -> list[dict]:
    """One row per (group, VAD, compute time): WER of the committed text and of offline."""
    rows = []
    for group, items in groups.items():
        offline = {name: model.transcribe(audio)["text"] for name, (audio, _) in items.items()}
        o_edits, words = corpus_errors([(items[n][1], offline[n]) for n in items])
        for vad in {"both": (True, False), "on": (True,), "off": (False,)}[args.vad]:
            for compute in args.computes:
                t0 = time.perf_counter()
                texts = {
                    n: stream_run(model, a, 1.0, False, compute, args.confident, vad)["text"]
                    for n, (a, _) in items.items()
                }
                s_edits, _ = corpus_errors([(items[n][1], texts[n]) for n in items])
                lost = missing([(offline[n], texts[n]) for n in items])
                row = {"group": group, "vad": vad, "compute": compute, "wer": s_edits / words}
                row.update(offline_wer=o_edits / words, lost=lost, seconds=time.perf_counter() - t0)
                rows.append(row)
                print(
                    f"{group[:28]:<28} {'vad' if vad else 'no_vad':<6} {compute:>5.1f} s  stream "
                    f"{row['wer']:6.1%}  offline {row['offline_wer']:6.1%}  missing vs offline {lost:>3}"
                    f"  ({row['seconds']:.0f} s)",
                    flush=True,
                )
    return rows


def main() -> int:
    from whisperkv.cli_types import probability

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--compute_type", default="default", help="the model's (int8, bfloat16: approximations)")
    p.add_argument("--confident", type=probability, default=None, metavar="P")
    p.add_argument("--computes", type=lambda s: [float(x) for x in s.split(",")], default=list(COMPUTES))
    p.add_argument("--no_clips", action="store_true", help="only the three long inputs and jfk")
    p.add_argument("--only", default="", metavar="NAMES", help="the inputs whose names contain one of these")
    p.add_argument("--vad", choices=("both", "on", "off"), default="both", help="with the VAD, without, both")
    args = p.parse_args()
    if not (SPEECH / "manifest.tsv").is_file():
        print(f"no speech set at {SPEECH}", file=sys.stderr)
        return 2
    import whisperkv

    print(machine(), flush=True)
    policy = "LocalAgreement-2" + (f", confident >= {args.confident:g}" if args.confident else "")
    print(f"{args.model} {args.compute_type}, 1 s chunks, {policy}; clock: a fixed compute per update")
    model = whisperkv.load_model(args.model, compute_type=args.compute_type)
    english = clips()
    groups = {name: {name: value} for name, value in inputs(None).items()}
    groups["jfk"] = {"jfk": english["jfk"]}
    if not args.no_clips:
        groups[f"{len(english)} English clips"] = english
    wanted = [n for n in args.only.split(",") if n]
    groups = {g: items for g, items in groups.items() if not wanted or any(n in g for n in wanted)}
    rows = sweep(model, groups, args)
    print("\ngoals (issue 42):")
    met_all = True
    for r in rows:
        goal = r["lost"] == 0 if r["group"] == "jfk" else r["wer"] <= r["offline_wer"] + WER_POINTS / 100
        met_all &= goal
        what = "0 words of offline missing" if r["group"] == "jfk" else "WER within 1 pt of offline"
        vad = "vad" if r["vad"] else "no_vad"
        verdict = "met" if goal else "NOT met"
        print(f"  {verdict:<8} {r['group'][:28]:<28} {vad:<6} {r['compute']:>4.1f} s  {what}")
    print(f"all goals: {'met' if met_all else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
