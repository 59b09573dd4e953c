"""The faster-whisper API side by side: ``whisperkv.WhisperModel`` and faster-whisper's, same file, same
call, same CTranslate2 weights (tiny.en's, which whisperkv reads directly; base joined into one dir).

    PYTHONPATH=. .venv/bin/python benchmarks/faster_api.py                          # jfk, greedy, float32
    PYTHONPATH=. .venv/bin/python benchmarks/faster_api.py --audio FILE --beam_size 5 --compute_type int8
    PYTHONPATH=. .venv/bin/python benchmarks/faster_api.py --batched --batch_size 8

The code each engine runs is the same text but for the import (``from whisperkv import WhisperModel``
against ``from faster_whisper import WhisperModel``). Each runs in a process of its own (CTranslate2's
OpenMP threads keep spinning after a call and would slow the next engine), with the same thread count;
the model is loaded and warmed up once, then the file is transcribed ``--repeats`` times, interleaved.
Printed: per engine the median seconds, the real-time factor, the text, and whether the two texts are
identical; with a reference (a file of ../shared/data/speech) each one's WER (jiwer, Whisper's English
normaliser).
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech"
ENGINES = ("whisperkv", "faster-whisper")


def model_dir(model: str, tmp: Path) -> str:
    """The CTranslate2 directory both engines load."""
    from whisperkv.weights import registry

    if model == "tiny.en":
        return str(registry._tiny_en_dir())
    if model != "base" or registry._base_parts() is None:
        return model  # a path: a CTranslate2 directory both can read
    parts = registry._base_parts()
    out = tmp / "base-ct2"
    out.mkdir(exist_ok=True)
    with open(out / "model.bin", "wb") as f:
        for part in (parts[0] / "model.bin.part1", parts[1] / "model.bin.part2"):
            f.write(part.read_bytes())
    for name in ("config.json", "tokenizer.json", "vocabulary.txt", "vocabulary.json"):
        for d in parts:
            if (d / name).is_file():
                (out / name).write_bytes((d / name).read_bytes())
                break
    return str(out)


def worker(engine: str, args: argparse.Namespace, directory: str, jobs, results) -> None:  # noqa: ANN001
    if engine == "whisperkv":
        from whisperkv import BatchedInferencePipeline, WhisperModel
    else:
        from faster_whisper import BatchedInferencePipeline, WhisperModel

    model = WhisperModel(directory, device="cpu", compute_type=args.compute_type, cpu_threads=args.threads)
    runner = BatchedInferencePipeline(model) if args.batched else model
    options = {"beam_size": args.beam_size, "language": args.language}
    if args.batched:
        options["batch_size"] = args.batch_size

    def run() -> tuple[float, str]:
        start = time.perf_counter()
        segments, _ = runner.transcribe(args.audio, **options)
        text = "".join(s.text for s in segments)  # the segments are lazy: reading them is the work
        return time.perf_counter() - start, text

    run()  # warm-up
    results.put(("ready", engine))
    while jobs.get() is not None:
        results.put((engine, *run()))


def reference_of(audio: Path) -> str | None:
    try:
        relative = audio.resolve().relative_to(SPEECH.resolve())
    except ValueError:
        return None
    with open(SPEECH / "manifest.tsv", encoding="utf-8") as f:
        rows = {row["file"]: row["reference"] for row in csv.DictReader(f, delimiter="\t")}
    return rows.get(str(relative))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--audio", default=str(SPEECH / "en" / "jfk.flac"))
    p.add_argument("--model", default="tiny.en", help="tiny.en, base, or a CTranslate2 directory")
    p.add_argument("--compute_type", default="float32")
    p.add_argument("--beam_size", type=int, default=1)
    p.add_argument("--language", default="en")
    p.add_argument("--batched", action="store_true", help="BatchedInferencePipeline")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        directory = model_dir(args.model, Path(tmp))
        queues = {e: (ctx.Queue(), ctx.Queue()) for e in ENGINES}
        procs = [ctx.Process(target=worker, args=(e, args, directory, *queues[e])) for e in ENGINES]
        for proc in procs:
            proc.start()
        for e in ENGINES:
            assert queues[e][1].get(timeout=600) == ("ready", e)
        times: dict[str, list[float]] = {e: [] for e in ENGINES}
        texts: dict[str, str] = {}
        for _ in range(args.repeats):
            for e in ENGINES:  # interleaved: one engine at a time on the CPU
                queues[e][0].put(1)
                _, seconds, texts[e] = queues[e][1].get(timeout=1800)
                times[e].append(seconds)
        for e in ENGINES:
            queues[e][0].put(None)
        for proc in procs:
            proc.join(60)
    report(args, times, texts)
    return 0


def report(args: argparse.Namespace, times: dict[str, list[float]], texts: dict[str, str]) -> None:
    import av

    with av.open(args.audio) as container:
        duration = float(container.duration / 1e6) if container.duration else float("nan")
    mode = f"{args.compute_type}, beam {args.beam_size}" + (
        f", batched {args.batch_size}" if args.batched else ""
    )
    print(
        f"{args.audio} ({duration:.1f} s), {args.model}, {mode}, {args.threads} threads, {args.repeats} runs"
    )
    reference = reference_of(Path(args.audio))
    wer = None
    if reference is not None:
        import jiwer
        from whisper_normalizer.english import EnglishTextNormalizer

        normalise = EnglishTextNormalizer()
        wer = {e: jiwer.wer(normalise(reference), normalise(t)) for e, t in texts.items()}
    for e in ENGINES:
        median = statistics.median(times[e])
        line = f"  {e:<15} {median:7.3f} s  RTF {median / duration:.4f}"
        line += f"  WER {wer[e]:.3f}" if wer else ""
        print(line + f"  {texts[e].strip()!r}")
    ratio = statistics.median(times["whisperkv"]) / statistics.median(times["faster-whisper"])
    same = texts["whisperkv"] == texts["faster-whisper"]
    print(f"  whisperkv / faster-whisper time: {ratio:.2f}; texts identical: {same}")


if __name__ == "__main__":
    sys.exit(main())
