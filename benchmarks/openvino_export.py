"""OpenVINO GenAI's Whisper, exported offline from whisperkv's own weights: the benchmarks' Intel peer.

    PYTHONPATH=. .venv/bin/python benchmarks/openvino_export.py tiny.en /tmp/ov            # both kinds
    PYTHONPATH=. .venv/bin/python benchmarks/openvino_export.py model.pt /tmp/ov --kinds int8

The source (a model name or any file ``whisperkv.load_model`` reads) is written as a transformers
directory by ``whisperkv convert --format transformers``, and that directory is exported to OpenVINO IR
by optimum-intel (``optimum-cli export openvino``, task ``automatic-speech-recognition-with-past``), with
the hub switched off: nothing is fetched. Two kinds, as a user of OpenVINO exports them:

* ``default``: optimum-intel's default, float32 weights (for a model under a billion parameters); the CPU
  plugin then infers at its default precision, bfloat16 on a CPU with AVX512-BF16 or AMX;
* ``int8``: ``--weight-format int8``, NNCF's per-channel int8 weights (activations stay floating point).

Each kind's directory is what ``openvino_genai.WhisperPipeline(directory, "CPU")`` loads. Needs the
``bench`` extra (openvino-genai, optimum-intel, nncf).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

#: the kinds of export, each with the optimum-cli arguments that make it
KINDS = {"default": (), "int8": ("--weight-format", "int8")}
TASK = "automatic-speech-recognition-with-past"


def transformers_dir(source: str | Path, directory: Path) -> Path:
    """``directory/transformers``: whisperkv's transformers export of ``source`` (written once)."""
    from whisperkv.weights.convert import convert

    out = directory / "transformers"
    return out if (out / "config.json").is_file() else convert(source, out, "transformers")


def export_openvino(source: str | Path, directory: str | Path, kind: str = "default") -> Path:
    """``directory/openvino-KIND``, the OpenVINO GenAI pipeline of ``source``; exported once, offline.

    Raises ValueError for an unknown kind and RuntimeError (with optimum-cli's last lines) when the
    export fails."""
    if kind not in KINDS:
        raise ValueError(f"unknown OpenVINO export kind {kind!r}: one of {', '.join(KINDS)}")
    directory = Path(directory)
    out = directory / f"openvino-{kind}"
    if (out / "openvino_decoder_model.xml").is_file():
        return out
    hf = transformers_dir(source, directory)
    partial = directory / f".openvino-{kind}.partial"  # renamed once whole: a stopped export is redone
    shutil.rmtree(partial, ignore_errors=True)
    command = [sys.executable, "-m", "optimum.commands.optimum_cli", "export", "openvino"]
    command += ["--model", str(hf), "--task", TASK, *KINDS[kind], str(partial)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # never a hub
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0 or not (partial / "openvino_decoder_model.xml").is_file():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        shutil.rmtree(partial, ignore_errors=True)
        raise RuntimeError(f"optimum-cli export openvino ({kind}) failed:\n{tail}")
    os.replace(partial, out)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", help="model name or path (anything whisperkv.load_model reads)")
    parser.add_argument("directory", help="where the transformers and OpenVINO directories are written")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of: {', '.join(KINDS)}")
    args = parser.parse_args()
    for kind in args.kinds.split(","):
        print(export_openvino(args.source, args.directory, kind))
    return 0


if __name__ == "__main__":
    sys.exit(main())
