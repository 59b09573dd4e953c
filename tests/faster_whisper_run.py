"""Run faster-whisper itself on a list of cases, in a process of its own; print the results as JSON.

``python tests/faster_whisper_run.py CASES.json``: CASES is {name: {"model_dir", "audio" (a path), "options",
"batched"}}; every case's segments (with words) and info come back. A process of its own because
CTranslate2's OpenMP threads keep spinning after a call and slow the next whisperkv call in the same one.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict


def run(cases: dict) -> dict:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    models: dict = {}
    out = {}
    for name, case in cases.items():
        key = (case["model_dir"], case.get("compute_type", "float32"))
        if key not in models:
            models[key] = WhisperModel(key[0], device="cpu", compute_type=key[1], cpu_threads=1)
        model = models[key]
        runner = BatchedInferencePipeline(model) if case.get("batched") else model
        segments, info = runner.transcribe(case["audio"], **case.get("options", {}))
        out[name] = {
            "segments": [asdict(s) for s in segments],
            "language": info.language,
            "language_probability": info.language_probability,
            "all_language_probs": info.all_language_probs,
            "duration": info.duration,
            "duration_after_vad": info.duration_after_vad,
        }
    return out


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        print(json.dumps(run(json.load(f))))
