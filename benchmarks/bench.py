"""Side by side: whisperkv, faster-whisper, whisper.cpp and openai-whisper, on the same weights.

    PYTHONPATH=. .venv/bin/python benchmarks/bench.py                    # tiny.en, all audio, greedy + beam 5
    PYTHONPATH=. .venv/bin/python benchmarks/bench.py --model base       # the same table for base
    PYTHONPATH=. .venv/bin/python benchmarks/bench.py --quick            # short clip only, greedy

Each engine runs in its own worker process (model loaded once, load time excluded), all with the same
thread count; runs are interleaved A B C A B C ... and the table reports medians. Peers come with the
``whisperkv[bench]`` extra (faster-whisper, pywhispercpp; openai-whisper is in the test extra); a missing
one is reported and skipped. Audio is built at run time from ../shared/data/speech, never committed:
``short`` (jfk, 11 s), ``long`` (both long recordings then short clips, >= 5 min) and ``utterances``
(the short English clips in a shuffled order with random pauses between them). whisper.cpp reads a
float16 ggml file written from the same OpenAI ``.pt`` by ``ggml_export.py`` into a temporary directory.

Printed first: the CPU, the BLAS libraries, the versions and the commit; then per engine and audio the
median time, real-time factor, peak RSS, WER (with errors/words), output tokens, ms per output token,
30 s windows per minute of audio, and for whisperkv the measured decoder ms per step (one new token
for every row of a window: a beam-5 step advances five rows; the whole engine step — the layers, the
vocabulary or its int8 screen, the token choice and a greedy window's deferred log-probabilities);
then every goal of performance issue 16 as met / NOT met in this run.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import describe  # noqa: E402

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech"
SAMPLE_RATE = 16000
ENCODER_GFLOP_TINY = 36.9  # per 30 s window, as the performance issue counts it
BATCH_SIZE = 8  # batched engines, ours and faster-whisper's, decode this many chunks at once


# ---------------------------------------------------------------- engines (run inside worker processes)


class Engine:
    name = ""

    def transcribe(self, audio: np.ndarray, beam_size: int | None) -> dict:
        """{"text", "tokens" (output tokens or None), "windows" (30 s windows decoded or None), ...}."""
        raise NotImplementedError


class WhisperKV(Engine):
    def __init__(
        self,
        model: str,
        compute_type: str,
        batched: bool = False,
        vad: str = "energy",
        screen: bool = False,
        sdpa: bool = False,
        hold_end: bool = True,
        gemm: bool = False,
        calls: bool = False,
        head_by_head: bool = False,
    ) -> None:
        import torch

        import whisperkv
        from whisperkv.model.attend_kernel import use_attention_kernels
        from whisperkv.model.vocab import current_layout

        self.model = whisperkv.load_model(model, compute_type=compute_type, vocab_screen=screen)
        if sdpa:  # PyTorch's SDPA everywhere: int8 as before round 6, float32 as before round 9
            use_attention_kernels(self.model, on=False)
        if gemm:  # float32 steps' linears through the row GEMMs (before round 11); int8 steps with
            # PyTorch between the kernels (LayerNorms, GELU, residuals; before round 15)
            use_attention_kernels(self.model, rows=False)
        if head_by_head:  # the int8 type's bfloat16 encoder head by head, as before round 15 with AMX
            use_attention_kernels(self.model, head_by_head=True)
        if calls:  # float32 blocks' steps call by call from Python, as before round 13
            from whisperkv.model.block_step import use_block_step

            use_block_step(self.model.decoder, on=False)
        layout = current_layout(self.model.decoder)
        if any(getattr(m, "kernel", None) is not None for m in self.model.decoder.blocks[0].mlp.modules()):
            layout += " rows kernel"
        if self.model.decoder.blocks[0].step_rows is not None:
            layout += ", linears kernel"
        if self.model.decoder.blocks[0].block_step is not None:
            layout += ", block step"
        if self.model.decoder.attention_kernel is not None:
            layout += ", attn kernel"
        if self.model.decoder.kv_dtype == torch.bfloat16:
            layout += ", bf16 caches"
        if self.model.encoder.blocks[0].attn.kernel is not None:
            layout += ", encoder head by head"
        self.name = f"whisperkv {compute_type}" + (f" batched {vad}" if batched else "") + f" [{layout}]"
        self.name += " screened" if self.model.decoder.vocab_screen is not None else ""
        self.name += " no hold" if batched and not hold_end else ""
        self.name += " system heap" if os.environ.get("WHISPERKV_HEAP") == "system" else ""
        self.batched, self.vad, self.hold_end = batched, vad, hold_end
        self._steps = [0, 0.0]  # decoder steps (one new token for every row of a window) and their seconds
        forward, forward_rows = self.model.decoder.forward, self.model.decoder.forward_rows

        def timed_forward(tokens, cache, positions=None):  # noqa: ANN001, ANN202 - the decoder's signature
            start = time.perf_counter()
            out = forward(tokens, cache, positions)
            if tokens.shape[-1] == 1:  # a step of the batched mode's loop (the prompt is not a step)
                self._steps[0] += 1
                self._steps[1] += time.perf_counter() - start
            return out

        def timed_forward_rows(groups, project=True):  # noqa: ANN001, ANN202 - the engine's step
            start = time.perf_counter()
            out = forward_rows(groups, project)
            self._steps[0] += 1
            self._steps[1] += time.perf_counter() - start
            return out

        self.model.decoder.forward = timed_forward
        self.model.decoder.forward_rows = timed_forward_rows
        # the engine's step goes on after forward_rows: the vocabulary (every logit, or the int8 screen of
        # greedy rows and their deferred log-probabilities) and the token choice. Timed as part of it.
        self._time_engine_vocabulary()

    def _time_engine_vocabulary(self) -> None:
        from whisperkv.decoding.window import WindowDecode

        steps, inside = self._steps, [False]
        model = self.model

        def timed(call):  # noqa: ANN001, ANN202 - adds a call's seconds once (not again when nested)
            def run(*args):  # noqa: ANN002, ANN202
                if inside[0]:
                    return call(*args)
                inside[0] = True
                start = time.perf_counter()
                try:
                    return call(*args)
                finally:
                    steps[1] += time.perf_counter() - start
                    inside[0] = False

            return run

        class TimedWindow(WindowDecode):
            def advance(self, logits):  # noqa: ANN001, ANN202
                timed(super().advance)(logits)

            def advance_screened(self, *rows):  # noqa: ANN002, ANN202
                timed(super().advance_screened)(*rows)

            def _screened_sums(self):  # noqa: ANN202
                timed(super()._screened_sums)()

        model.decoder.project = timed(model.decoder.project)  # the full rows' logits
        screen = model.decoder.vocab_screen
        if screen is not None:  # greedy rows: the int8 products of the screen
            screen.approximate = timed(screen.approximate)
        import whisperkv.engine.scheduler as scheduler

        scheduler.WindowDecode = TimedWindow  # this benchmark process only

    def transcribe(self, audio, beam_size):
        self._steps[:] = [0, 0.0]
        if self.batched:
            from whisperkv.batched import transcribe_batched

            result = transcribe_batched(
                self.model,
                audio,
                beam_size=beam_size,
                batch_size=BATCH_SIZE,
                vad=self.vad,
                hold_end=self.hold_end,
                language="en",
            )
            windows = result["batched"]["windows"] + result["batched"]["fallbacks"]
        else:
            # the language is given, as to every peer: a multilingual model would otherwise detect it,
            # which costs a clip shorter than 30 s a second encoder pass (the detection window is the
            # first 30 s of the padded log-Mel, as in openai-whisper, not the clip's own window)
            result = self.model.transcribe(audio, beam_size=beam_size, best_of=5, language="en")
            windows = len({s["seek"] for s in result["segments"]})
        return {
            "text": result["text"],
            "tokens": sum(len(s["tokens"]) for s in result["segments"]),
            "windows": windows,
            "steps": self._steps[0],
            "step_s": self._steps[1],
        }


class FasterWhisper(Engine):
    def __init__(self, model_dir: str, compute_type: str, threads: int, batched: bool = False) -> None:
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        self.name = f"faster-whisper {compute_type}" + (" batched" if batched else "")
        self.model = WhisperModel(model_dir, device="cpu", compute_type=compute_type, cpu_threads=threads)
        self.pipeline = BatchedInferencePipeline(self.model) if batched else None

    def transcribe(self, audio, beam_size):
        if self.pipeline is not None:
            segments, _ = self.pipeline.transcribe(
                audio, language="en", beam_size=beam_size or 1, batch_size=BATCH_SIZE
            )
        else:
            segments, _ = self.model.transcribe(audio, language="en", beam_size=beam_size or 1, best_of=5)
        segments = list(segments)
        return {
            "text": "".join(s.text for s in segments),
            "tokens": sum(len(s.tokens) for s in segments),
            "windows": len({s.seek for s in segments}) if self.pipeline is None else None,
        }


class WhisperCpp(Engine):
    """whisper.cpp through pywhispercpp, on a float16 ggml file written from the same .pt."""

    def __init__(self, ggml_path: str, threads: int) -> None:
        self.name = "whisper.cpp f16"
        self.models: dict = {}
        self.path, self.threads = ggml_path, threads
        self.model_for(None)

    def model_for(self, beam_size):
        from pywhispercpp.model import Model

        key = beam_size or 1
        if key not in self.models:  # one context per strategy: greedy, and beam search when asked
            params = dict(n_threads=self.threads, print_progress=False, print_realtime=False, language="en")
            if key > 1:
                params.update(params_sampling_strategy=1, beam_search={"beam_size": key, "patience": -1.0})
            self.models[key] = Model(self.path, redirect_whispercpp_logs_to=None, **params)
        return self.models[key]

    def transcribe(self, audio, beam_size):
        segments = self.model_for(beam_size).transcribe(audio)
        return {"text": "".join(s.text for s in segments), "tokens": None, "windows": None}


class OpenAIWhisper(Engine):
    def __init__(self, pt_path: str) -> None:
        import whisper

        self.name = "openai-whisper fp32"
        self.model = whisper.load_model(pt_path, device="cpu")

    def transcribe(self, audio, beam_size):
        result = self.model.transcribe(audio, beam_size=beam_size, best_of=5, fp16=False, language="en")
        return {
            "text": result["text"],
            "tokens": sum(len(s["tokens"]) for s in result["segments"]),
            "windows": len({s["seek"] for s in result["segments"]}),
        }


ENGINES = (
    "whisperkv-fp32",
    "whisperkv-fp32-sdpa",
    "whisperkv-fp32-gemm",
    "whisperkv-fp32-screened",
    "whisperkv-fp32-unscreened",
    "whisperkv-fp32-sysheap",
    "whisperkv-fp32-calls",
    "whisperkv-int8",
    "whisperkv-int8-sdpa",
    "whisperkv-int8-pytorch",
    "whisperkv-int8-headbyhead",
    "whisperkv-batched-int8",
    "whisperkv-batched-int8-sdpa",
    "whisperkv-batched-fp32",
    "whisperkv-batched-int8-silero",
    "whisperkv-batched-int8-nohold",
    "faster-whisper-fp32",
    "faster-whisper-int8",
    "faster-whisper-batched-int8",
    "faster-whisper-batched-fp32",
    "whisper.cpp-f16",
    "openai-whisper-fp32",
)


#: engine suffixes naming a default engine with one of its fast paths off (printed as ratios to it)
TWINS = ("-sdpa", "-gemm", "-sysheap", "-calls", "-pytorch", "-headbyhead")


def _make_engine(spec: str, threads: int, paths: dict) -> Engine:
    if spec.startswith("whisperkv-"):
        if spec.endswith("-sysheap"):  # glibc's heap defaults: the twin of whisperkv/heap.py's settings
            from whisperkv.heap import OPT_OUT

            os.environ[OPT_OUT] = "system"
        compute = "int8" if "int8" in spec else "float32"
        vad = "silero" if "silero" in spec else "energy"
        return WhisperKV(
            paths["model"],
            compute,
            "batched" in spec,
            vad,
            screen=spec.endswith("-screened"),
            sdpa=spec.endswith("-sdpa"),
            hold_end=not spec.endswith("-nohold"),
            gemm=spec.endswith(("-gemm", "-pytorch")),  # int8: PyTorch between its kernels, before round 15
            calls=spec.endswith("-calls"),
            head_by_head=spec.endswith("-headbyhead"),
        )
    if spec.startswith("faster-whisper-"):
        compute = "int8" if spec.endswith("int8") else "float32"
        return FasterWhisper(paths["ct2_dir"], compute, threads, batched="batched" in spec)
    if spec == "whisper.cpp-f16":
        return WhisperCpp(paths["ggml"], threads)
    if spec == "openai-whisper-fp32":
        return OpenAIWhisper(paths["pt"])
    raise ValueError(f"unknown engine {spec!r}: one of {', '.join(ENGINES)}")


def _worker(spec: str, threads: int, paths: dict, audios: dict, conn) -> None:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        import torch

        torch.set_num_threads(threads)
        engine = _make_engine(spec, threads, paths)
        engine.transcribe(audios["warmup"], None)  # first call pays one-off costs
    except Exception as exc:  # noqa: BLE001 - an unavailable peer is reported, not fatal
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", engine.name))
    while True:
        job = conn.recv()
        if job is None:
            break
        name, beam = job
        start = time.perf_counter()
        run = engine.transcribe(audios[name], beam)
        elapsed = time.perf_counter() - start
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        conn.send(("done", elapsed, run, rss))


def model_files(model: str, tmp: Path) -> dict:
    """The same weights for every engine: our .pt export, a CTranslate2 dir, a ggml file."""
    from ggml_export import write_ggml

    from whisperkv.weights import registry
    from whisperkv.weights.convert import convert

    pt = convert(model, tmp / f"{model}.pt", "pt")
    if model == "tiny.en":
        ct2_dir = registry._tiny_en_dir()
    else:  # base ships as two halves of one model.bin: faster-whisper needs it whole
        parts = registry._base_parts()
        ct2_dir = tmp / "base-ct2"
        ct2_dir.mkdir()
        with open(ct2_dir / "model.bin", "wb") as out:
            for part in (parts[0] / "model.bin.part1", parts[1] / "model.bin.part2"):
                out.write(part.read_bytes())
        for name in ("config.json", "tokenizer.json", "vocabulary.txt", "vocabulary.json"):
            for d in parts:
                if (d / name).is_file():
                    shutil.copy(d / name, ct2_dir / name)
                    break
    ggml = write_ggml(pt, tmp / "ggml.bin")
    return {"model": model, "pt": str(pt), "ct2_dir": str(ct2_dir), "ggml": str(ggml)}


# ---------------------------------------------------------------- audio and references


def _manifest() -> list[dict]:
    with open(SPEECH / "manifest.tsv", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def build_audio(
    min_long_seconds: float = 300.0, min_utterance_seconds: float = 180.0, seed: int = 0
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    from whisperkv.audio import load_audio

    rows = [r for r in _manifest() if r["language"] == "en"]
    by_id = {r["id"]: r for r in rows}
    audios = {
        "short": load_audio(SPEECH / by_id["jfk"]["file"]),
        "warmup": load_audio(SPEECH / by_id["jfk"]["file"])[: 3 * SAMPLE_RATE],  # one-off costs only
    }
    refs = {"short": by_id["jfk"]["reference"]}
    # long-form: both long recordings, then short clips, 0.5 s of silence between, until >= 5 min
    order = [r for r in rows if r["file"].startswith("long/")] + [
        r for r in rows if r["file"].startswith("en/")
    ]
    pieces, texts, total = [], [], 0
    gap = np.zeros(SAMPLE_RATE // 2, dtype=np.float32)
    for r in order:
        a = load_audio(SPEECH / r["file"])
        pieces += [a, gap]
        texts.append(r["reference"])
        total += len(a) + len(gap)
        if total >= min_long_seconds * SAMPLE_RATE:
            break
    audios["long"] = np.concatenate(pieces)
    refs["long"] = " ".join(texts)
    # many short utterances: the short clips in a seeded shuffled order with pauses of 0.3-3 s between,
    # reshuffled and repeated until the file is long enough
    rng = random.Random(seed)
    short = [r for r in rows if r["file"].startswith("en/") and r["id"] != "jfk"]
    pieces, texts, total = [np.zeros(SAMPLE_RATE, dtype=np.float32)], [], SAMPLE_RATE
    while total < min_utterance_seconds * SAMPLE_RATE:
        for r in rng.sample(short, len(short)):
            a = load_audio(SPEECH / r["file"])
            pause = np.zeros(int(rng.uniform(0.3, 3.0) * SAMPLE_RATE), dtype=np.float32)
            pieces += [a, pause]
            texts.append(r["reference"])
            total += len(a) + len(pause)
            if total >= min_utterance_seconds * SAMPLE_RATE:
                break
    audios["utterances"] = np.concatenate(pieces)
    refs["utterances"] = " ".join(texts)
    return audios, refs


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
RSS_GOALS = [
    ("whisperkv-fp32", "faster-whisper-fp32"),
    ("whisperkv-int8", "faster-whisper-int8"),
    ("whisperkv-batched-int8", "faster-whisper-batched-int8"),
    ("whisperkv-batched-fp32", "faster-whisper-batched-fp32"),
]


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def print_goals(table: dict, results: dict, refs: dict) -> None:
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
        step = results.get(("whisperkv-fp32", audio_name, mode))
        if step and mode == "greedy" and step[-1][1].get("steps"):
            ms = step[-1][1]["step_s"] / step[-1][1]["steps"] * 1e3
            print(
                f"  {audio_name:<10} {mode:<6} {'fp32 decoder step <= 3 ms':<40} {ms:5.2f}  "
                f"{_verdict(ms <= 3)}"
            )
        for ours, peer in RSS_GOALS:
            a, b = (ours, audio_name, mode), (peer, audio_name, mode)
            if a in results and b in results:
                mine, theirs = (max(r[2] for r in results[k]) / 2**20 for k in (a, b))
                print(
                    f"  {audio_name:<10} {mode:<6} {'peak RSS ' + ours[10:] + ' <= faster-whisper':<40} "
                    f"{mine:5.0f} vs {theirs:.0f} MB  {_verdict(mine <= theirs)}"
                )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny.en", choices=["tiny.en", "base"])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="short clip, greedy only")
    # the opt-in screen, and the int8 type without its attention kernel, when asked for (-unscreened: the
    # default float32 engine under another name, kept for round 11's commands, when the screen was on)
    default = [e for e in ENGINES if not e.endswith(("screened", "-nohold", *TWINS))]
    p.add_argument("--engines", default=",".join(default), help="comma list of: " + ", ".join(ENGINES))
    p.add_argument("--audio", default=None, help="comma list of short,long,utterances (default: all)")
    p.add_argument("--modes", default=None, help="comma list of greedy,beam5 (default: both)")
    p.add_argument("--utterance_seconds", type=float, default=180.0)
    p.add_argument(
        "--budget_s",
        type=float,
        default=float("inf"),
        help="start no new (audio, mode) round after this many seconds; print what was measured",
    )
    args = p.parse_args()

    from whisperkv.metrics import word_errors

    print(describe(args.threads))
    print("(the machine may be shared with other work: read the ratios, measured side by side)\n", flush=True)
    audio_names = (args.audio or ("short" if args.quick else "short,long,utterances")).split(",")
    modes = (args.modes or ("greedy" if args.quick else "greedy,beam5")).split(",")
    audios, refs = build_audio(min_utterance_seconds=args.utterance_seconds)
    durations = {k: len(v) / SAMPLE_RATE for k, v in audios.items()}
    tmp = Path(tempfile.mkdtemp(prefix="whisperkv-bench-"))
    try:
        paths = model_files(args.model, tmp)
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
        step = f"{last['step_s'] / last['steps'] * 1e3:12.2f}" if last.get("steps") else f"{'-':>12}"
        print(
            f"{names[spec]:<36}{audio_name:<11}{mode:<7}{median:>9.2f}{median / durations[audio_name]:>7.3f}"
            f"{rss:>8.0f}{errors / max(words, 1):>7.1%}{f'{errors}/{words}':>11}"
            f"{tokens if tokens else '-':>8}{per_token}{per_minute}{step}"
        )
    print("\nagreement with whisperkv float32 (word edits between the transcripts / words):")
    for (spec, audio_name, mode), runs in results.items():
        base = results.get(("whisperkv-fp32", audio_name, mode))
        if spec != "whisperkv-fp32" and base:
            errors, words = word_errors(base[-1][1]["text"], runs[-1][1]["text"])
            print(f"  {names[spec]:<36} {audio_name:<10} {mode:<6} {errors}/{words} words differ")
    print_goals(table, results, refs)
    print("\nratios (whisperkv time / peer time; < 1 means whisperkv is faster):")
    for (spec, audio_name, mode), t in table.items():
        if not spec.startswith("whisperkv"):
            continue
        for (peer, a2, m2), t2 in table.items():
            if peer.startswith("whisperkv") or (a2, m2) != (audio_name, mode):
                continue
            print(f"  {spec:<24} / {peer:<28} {audio_name:<10} {mode:<6} {t / t2:6.2f}")
    for (spec, audio_name, mode), t in table.items():  # the attention kernel against SDPA; the screen
        for suffix in ("-screened", "-unscreened", *TWINS):
            plain = (spec.removesuffix(suffix), audio_name, mode)
            if spec.endswith(suffix) and plain in table:
                print(f"  {plain[0]:<24} / {spec:<28} {audio_name:<10} {mode:<6} {table[plain] / t:6.2f}")
    return 0


def run_engines(args, paths: dict, audios: dict, audio_names: list, modes: list) -> dict:
    """Start one worker per engine, run every (audio, mode) interleaved, and collect the runs."""
    ctx = mp.get_context("spawn")
    workers = {}
    for spec in args.engines.split(","):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(spec, args.threads, paths, audios, child), daemon=True)
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
