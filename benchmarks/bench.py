"""Side by side: whisperkv, faster-whisper, whisper.cpp, OpenVINO GenAI and openai-whisper, same weights.

    PYTHONPATH=. .venv/bin/python benchmarks/bench.py                    # tiny.en, all audio, greedy + beam 5
    PYTHONPATH=. .venv/bin/python benchmarks/bench.py --model base       # the same table for base
    PYTHONPATH=. .venv/bin/python benchmarks/bench.py --quick            # short clip only, greedy
    PYTHONPATH=. .venv/bin/python benchmarks/bench.py --before ../old    # also each whisperkv engine from
                                                                         # an older checkout: after / before

Each engine runs in its own worker process (model loaded once, load time excluded), all with the same
thread count; runs are interleaved A B C A B C ... and the table reports medians. Peers come with the
``whisperkv[bench]`` extra (faster-whisper, pywhispercpp, openvino-genai with optimum-intel;
openai-whisper is in the test extra); a missing one is reported and skipped. OpenVINO runs an export
of the same weights made offline at the start (``openvino_export.py``: ``openvino-default``, float32
weights at the CPU plugin's default precision, and ``openvino-int8``); ``whisperkv-fp32-nokernels``
is the float32 type with ``CC=false`` (no C kernels: what a machine without a compiler runs).
Audio is built at run time from ../shared/data/speech, never committed: ``short`` (jfk, 11 s), ``long``
(both long recordings then short clips, >= 5 min) and ``utterances`` (the short English clips in a
shuffled order with random pauses between them). whisper.cpp reads a float16 ggml file written from the
same OpenAI ``.pt`` by ``ggml_export.py`` into a temporary directory.

Printed first: the CPU, the BLAS libraries, the versions and the commit; then per engine and audio the
median time, real-time factor, peak RSS, WER (with errors/words), output tokens, ms per output token,
30 s windows per minute of audio, and for whisperkv the measured decoder ms per step (one new token
for every row of a window: a beam-5 step advances five rows; the whole engine step — the layers, the
vocabulary, the token choice and a greedy window's deferred log-probabilities);
then every goal of performance issue 16 as met / NOT met in this run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engines import BATCH_SIZE, BEFORE, ENGINES, worker  # noqa: E402
from bench_inputs import SAMPLE_RATE, SPEECH, build_audio, model_files, openvino_files  # noqa: E402, F401
from provenance import describe  # noqa: E402

ENCODER_GFLOP_TINY = 36.9  # per 30 s window, as the performance issue counts it


def gemm_and_encoder(threads: int, model_name: str, repeats: int = 7) -> tuple[float, float]:
    """Measured fp32 GEMM throughput (GFLOP/s, 1536^3) and encoder seconds per window, medians.

    The two are timed alternately, so both see the machine in the same state: on a shared VM its speed
    drifts by tens of percent within minutes, and a ratio of two measurements taken apart is not one.
    """
    import torch

    import whisperkv

    torch.set_num_threads(threads)
    n = 1536
    a, b = torch.randn(n, n), torch.randn(n, n)
    model = whisperkv.load_model(model_name)
    mel = torch.randn(1, model.dims.n_mels, 3000)
    a @ b
    model.embed_audio(mel)
    gemm, encoder = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(4):
            a @ b
        gemm.append((time.perf_counter() - t) / 4)
        t = time.perf_counter()
        model.embed_audio(mel)
        encoder.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(gemm) / 1e9, statistics.median(encoder)


# ---------------------------------------------------------------- goals of performance issue 16

# (goal, whisperkv engine, peer engine, modes, largest allowed time ratio)
SPEED_GOALS = [
    ("fp32 <= 0.8 x faster-whisper fp32", "whisperkv-fp32", "faster-whisper-fp32", 0.8),
    ("int8 <= 0.7 x faster-whisper int8", "whisperkv-int8", "faster-whisper-int8", 0.7),
    ("batched int8 <= 0.7 x fw batched int8", "whisperkv-batched-int8", "faster-whisper-batched-int8", 0.7),
    ("batched fp32 <= 0.7 x fw batched fp32", "whisperkv-batched-fp32", "faster-whisper-batched-fp32", 0.7),
]
# issue 46: OpenVINO GenAI as a peer (tiny.en), and the float32 type where the C kernels cannot be built
# (``whisperkv-fp32-nokernels``: CC=false); (goal, whisperkv engine, peer engine, modes, largest ratio)
MODES = ("greedy", "beam5")
PEER_GOALS = [
    ("int8 <= 0.5 x OpenVINO int8", "whisperkv-int8", "openvino-int8", ("greedy",), 0.5),
    ("fp32 <= 0.9 x OpenVINO default", "whisperkv-fp32", "openvino-default", ("greedy",), 0.9),
    ("int8 ahead of OpenVINO int8", "whisperkv-int8", "openvino-int8", ("beam5",), 1.0),
    ("fp32 ahead of OpenVINO default", "whisperkv-fp32", "openvino-default", ("beam5",), 1.0),
    ("fp32 no kernels <= 1.0 x fw fp32", "whisperkv-fp32-nokernels", "faster-whisper-fp32", MODES, 1.0),
]
RSS_GOALS = [
    ("whisperkv-fp32", "faster-whisper-fp32"),
    ("whisperkv-int8", "faster-whisper-int8"),
    ("whisperkv-batched-int8", "faster-whisper-batched-int8"),
    ("whisperkv-batched-fp32", "faster-whisper-batched-fp32"),
]


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def step_ms(runs: list | None) -> float | None:
    """The median over an engine's runs of its decoder ms per step (None where it reports no steps): one
    run's figure moves with the VM's noise as much as its time does."""
    per_run = [r[1]["step_s"] / r[1]["steps"] * 1e3 for r in runs or [] if r[1].get("steps")]
    return statistics.median(per_run) if per_run else None


def quantisation_cost(
    results: dict, audio_name: str, mode: str, wer_of: Callable[[tuple], tuple[int, int]]
) -> str:
    """``; float32 errors: ours E (int8 +d), faster-whisper E (int8 +d)`` where both float32 engines ran
    in this run. An int8 WER gap splits into what each engine's int8 adds to its own float32 and what
    their float32 decodings (the reference's seek and beam search against CTranslate2's) differ by."""
    keys = [("whisperkv-fp32", audio_name, mode), ("faster-whisper-fp32", audio_name, mode)]
    if not all(k in results for k in keys):
        return ""
    parts = []
    for name, fp32, int8 in (
        ("ours", keys[0], "whisperkv-int8"),
        ("faster-whisper", keys[1], "faster-whisper-int8"),
    ):
        errors = wer_of(fp32)[0]
        parts.append(f"{name} {errors} (int8 {wer_of((int8, audio_name, mode))[0] - errors:+d})")
    return "; float32 errors: " + ", ".join(parts)


def print_goals(table: dict, results: dict, refs: dict, model: str = "tiny.en") -> None:
    from whisperkv.metrics import word_errors

    def wer_of(key):
        errors, words = word_errors(refs[key[1]], results[key][-1][1]["text"])
        return errors, words

    print("\ngoals of issue 16 (as measured in this run):")
    keys = sorted({(a, m) for _, a, m in table})
    for audio_name, mode in keys:
        for what, ours, peer, limit in SPEED_GOALS:
            a, b = (ours, audio_name, mode), (peer, audio_name, mode)
            if a in table and b in table:
                ratio = table[a] / table[b]
                print(f"  {audio_name:<10} {mode:<6} {what:<40} {ratio:5.2f}  {_verdict(ratio <= limit)}")
        for what, ours, peer, goal_modes, limit in PEER_GOALS:
            a, b = (ours, audio_name, mode), (peer, audio_name, mode)
            if mode in goal_modes and a in table and b in table:
                ratio = table[a] / table[b]
                print(f"  {audio_name:<10} {mode:<6} {what:<40} {ratio:5.2f}  {_verdict(ratio <= limit)}")
        fp32, ref = ("whisperkv-fp32", audio_name, mode), ("openai-whisper-fp32", audio_name, mode)
        if fp32 in results and ref in results:
            same = results[fp32][-1][1]["text"] == results[ref][-1][1]["text"]
            print(
                f"  {audio_name:<10} {mode:<6} {'fp32 text identical to openai-whisper':<40} "
                f"{'yes' if same else 'no':>5}  {_verdict(same)}"
            )
        ours, peer = ("whisperkv-int8", audio_name, mode), ("faster-whisper-int8", audio_name, mode)
        if ours in results and peer in results:
            (e1, w1), (e2, w2) = wer_of(ours), wer_of(peer)
            print(
                f"  {audio_name:<10} {mode:<6} {'int8 WER <= faster-whisper int8 WER':<40} "
                f"{e1 / w1:5.1%} ({e1}/{w1}) vs {e2 / w2:.1%} ({e2}/{w2})  {_verdict(e1 <= e2)}"
                + quantisation_cost(results, audio_name, mode, wer_of)
            )
        for batched, sequential in (
            ("whisperkv-batched-int8", "whisperkv-int8"),
            ("whisperkv-batched-fp32", "whisperkv-fp32"),
        ):
            b, q = (batched, audio_name, mode), (sequential, audio_name, mode)
            if b in results and q in results:
                (e1, w1), (e2, w2) = wer_of(b), wer_of(q)
                gap = (e1 / w1 - e2 / w2) * 100
                print(
                    f"  {audio_name:<10} {mode:<6} {batched[10:] + ' WER within 0.5 pt of sequential':<40} "
                    f"{e1 / w1:5.1%} ({e1}/{w1}) vs {e2 / w2:.1%} ({e2}/{w2}), {gap:+.1f} pt  "
                    f"{_verdict(gap <= 0.5)}"
                )
        ms = step_ms(results.get(("whisperkv-fp32", audio_name, mode)))
        if ms is not None and mode == "greedy":
            # the issue sets 3 ms for tiny.en; other models' steps are printed, with no verdict
            verdict = _verdict(ms <= 3) if model == "tiny.en" else f"(tiny.en's goal; {model} shown)"
            print(f"  {audio_name:<10} {mode:<6} {'fp32 decoder step <= 3 ms':<40} {ms:5.2f}  {verdict}")
        for ours, peer in RSS_GOALS:
            a, b = (ours, audio_name, mode), (peer, audio_name, mode)
            if a in results and b in results:
                mine, theirs = (max(r[2] for r in results[k]) / 2**20 for k in (a, b))
                print(
                    f"  {audio_name:<10} {mode:<6} {'peak RSS ' + ours[10:] + ' <= faster-whisper':<40} "
                    f"{mine:5.0f} vs {theirs:.0f} MB  {_verdict(mine <= theirs)}"
                )


def main() -> int:
    """Every engine on every (audio, mode), each in its own process, then the tables, goals and ratios."""
    args = parse_args()
    print(describe(args.threads))
    print("(the machine may be shared with other work: read the ratios, measured side by side)\n", flush=True)
    audio_names = (args.audio or ("short" if args.quick else "short,long,utterances")).split(",")
    modes = (args.modes or ("greedy" if args.quick else "greedy,beam5")).split(",")
    audios, refs = build_audio(min_utterance_seconds=args.utterance_seconds)
    durations = {k: len(v) / SAMPLE_RATE for k, v in audios.items()}
    tmp = Path(tempfile.mkdtemp(prefix="whisperkv-bench-"))
    try:
        paths = model_files(args.model, tmp)
        paths.update(openvino_files(args.model, args.engines.split(","), tmp))
        if args.before:
            paths["before"] = str(Path(args.before).resolve())
            before = [e + BEFORE for e in args.engines.split(",") if e.startswith("whisperkv-")]
            args.engines = ",".join([*args.engines.split(","), *before])
        results = run_engines(args, paths, audios, audio_names, modes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    table, names = results.pop("__table__"), results.pop("__names__")

    peak, enc = gemm_and_encoder(args.threads, args.model)
    print(f"\nmachine: {args.threads} threads; fp32 GEMM {peak:.1f} GFLOP/s (1536^3, median)")
    if args.model == "tiny.en":
        print(
            f"tiny encoder fp32: {enc * 1000:.0f} ms per 30 s window = "
            f"{ENCODER_GFLOP_TINY / enc:.1f} GFLOP/s "
            f"= {ENCODER_GFLOP_TINY / enc / peak:.0%} of measured GEMM peak"
        )
    else:
        print(f"{args.model} encoder fp32: {enc * 1000:.0f} ms per 30 s window")
    lengths = ", ".join(f"{k} {durations[k]:.1f} s" for k in audio_names)
    print(f"model {args.model}; audio: {lengths}; batch size {BATCH_SIZE}; {args.repeats} repeats, medians\n")
    print("engines (what each runs):")
    for spec, name in names.items():
        print(f"  {spec:<36} {name}")
    print()
    print_table(results, table, refs, durations)
    print_agreement(results)
    print_goals(table, results, refs, args.model)
    print_ratios(table)
    return 0


def parse_args() -> argparse.Namespace:
    """The benchmark's options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny.en", choices=["tiny.en", "base"])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="short clip, greedy only")
    p.add_argument("--engines", default=",".join(ENGINES), help="comma list of: " + ", ".join(ENGINES))
    p.add_argument(
        "--before",
        default=None,
        help="an older checkout (e.g. a git worktree): each whisperkv engine also runs from it, "
        f"as ENGINE{BEFORE}, interleaved with the rest, and the ratios print after / before",
    )
    p.add_argument("--audio", default=None, help="comma list of short,long,utterances (default: all)")
    p.add_argument("--modes", default=None, help="comma list of greedy,beam5 (default: both)")
    p.add_argument("--utterance_seconds", type=float, default=180.0)
    p.add_argument(
        "--budget_s",
        type=float,
        default=float("inf"),
        help="start no new (audio, mode) round after this many seconds; print what was measured",
    )
    return p.parse_args()


def print_table(results: dict, table: dict, refs: dict, durations: dict) -> None:
    """One row per (engine, audio, mode): the median time, RSS, word errors and per-token figures."""
    from whisperkv.metrics import word_errors

    header = (
        f"{'engine':<36}{'audio':<11}{'mode':<7}{'median s':>9}{'RTF':>7}{'RSS MB':>8}{'WER':>7}"
        f"{'err/words':>11}{'tokens':>8}{'ms/tok':>8}{'win/min':>8}{'dec ms/step':>12}"
    )
    print(header)
    print("-" * len(header))
    for (spec, audio_name, mode), runs in results.items():
        median = table[(spec, audio_name, mode)]
        last = runs[-1][1]
        errors, words = word_errors(refs[audio_name], last["text"])
        rss = max(r[2] for r in runs) / 2**20
        tokens = last.get("tokens")
        per_token = f"{median / tokens * 1e3:8.1f}" if tokens else f"{'-':>8}"
        windows = last.get("windows")
        per_minute = f"{windows / durations[audio_name] * 60:8.1f}" if windows else f"{'-':>8}"
        ms = step_ms(runs)
        step = f"{ms:12.2f}" if ms is not None else f"{'-':>12}"
        print(
            f"{spec:<36}{audio_name:<11}{mode:<7}{median:>9.2f}{median / durations[audio_name]:>7.3f}"
            f"{rss:>8.0f}{errors / max(words, 1):>7.1%}{f'{errors}/{words}':>11}"
            f"{tokens if tokens else '-':>8}{per_token}{per_minute}{step}"
        )


def print_agreement(results: dict) -> None:
    """Word edits between each engine's transcript and whisperkv float32's on the same audio and mode."""
    from whisperkv.metrics import word_errors

    print("\nagreement with whisperkv float32 (word edits between the transcripts / words):")
    for (spec, audio_name, mode), runs in results.items():
        base = results.get(("whisperkv-fp32", audio_name, mode))
        if spec != "whisperkv-fp32" and base:
            errors, words = word_errors(base[-1][1]["text"], runs[-1][1]["text"])
            print(f"  {spec:<36} {audio_name:<10} {mode:<6} {errors}/{words} words differ")


def print_ratios(table: dict) -> None:
    """whisperkv's median over each peer's on the same (audio, mode), and this checkout over --before's."""
    print("\nratios (whisperkv time / peer time; < 1 means whisperkv is faster):")
    for (spec, audio_name, mode), t in table.items():
        if not spec.startswith("whisperkv"):
            continue
        for (peer, a2, m2), t2 in table.items():
            if peer.startswith("whisperkv") or (a2, m2) != (audio_name, mode):
                continue
            print(f"  {spec:<24} / {peer:<28} {audio_name:<10} {mode:<6} {t / t2:6.2f}")
    for (spec, audio_name, mode), t in table.items():  # this checkout against --before's
        plain = (spec.removesuffix(BEFORE), audio_name, mode)
        if spec.endswith(BEFORE) and plain in table:
            print(f"  {plain[0]:<24} / {spec:<28} {audio_name:<10} {mode:<6} {table[plain] / t:6.2f}")


def run_engines(args, paths: dict, audios: dict, audio_names: list, modes: list) -> dict:
    """Start one worker per engine, run every (audio, mode) interleaved, and collect the runs."""
    ctx = mp.get_context("spawn")
    workers = {}
    for spec in args.engines.split(","):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker, args=(spec, args.threads, paths, audios, child), daemon=True)
        proc.start()
        status = parent.recv()
        if status[0] == "error":
            print(f"[skip] {spec}: {status[1]}", flush=True)
            proc.join()
            continue
        workers[spec] = (proc, parent, status[1])
    results: dict = {}
    started = time.perf_counter()
    rounds = [(a, m) for a in audio_names for m in modes]
    for i, (audio_name, mode) in enumerate(rounds):
        if time.perf_counter() - started > args.budget_s:
            skipped = ", ".join(f"{a} {m}" for a, m in rounds[i:])
            print(f"[budget] {args.budget_s:.0f} s spent: not run: {skipped}", flush=True)
            break
        beam = 5 if mode == "beam5" else None
        for rep in range(args.repeats):
            for spec, (_, conn, _) in workers.items():
                conn.send((audio_name, beam))
                _, elapsed, run, rss = conn.recv()
                results.setdefault((spec, audio_name, mode), []).append((elapsed, run, rss))
                print(f"  {spec:<28} {audio_name:<10} {mode:<6} run {rep + 1}: {elapsed:7.2f} s", flush=True)
    for proc, conn, _ in workers.values():
        conn.send(None)
        proc.join(timeout=10)
    results["__table__"] = {k: statistics.median(r[0] for r in runs) for k, runs in results.items()}
    results["__names__"] = {spec: name for spec, (_, _, name) in workers.items()}
    return results


if __name__ == "__main__":
    sys.exit(main())
