"""What ``bench.py`` (and the other benchmarks) run on: the same weights for every engine, and audio
built at run time from ../shared/data/speech (never committed) with its reference text."""

from __future__ import annotations

import csv
import random
import shutil
from pathlib import Path

import numpy as np

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech"
SAMPLE_RATE = 16000


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


def openvino_files(model: str, engines: list[str], tmp: Path) -> dict:
    """The OpenVINO exports the ``openvino-KIND`` engines among ``engines`` run, from the same weights
    (``openvino_export.py``); an export that fails is reported and its engine left out."""
    from openvino_export import export_openvino

    paths = {}
    for spec in engines:
        if spec.startswith("openvino-"):
            try:
                paths[spec] = str(export_openvino(model, tmp / "openvino", spec.removeprefix("openvino-")))
            except (ImportError, RuntimeError, ValueError) as err:
                print(f"[skip] {spec}: {err}", flush=True)
    return paths


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
