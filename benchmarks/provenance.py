"""Where a benchmark figure came from: the CPU, the BLAS libraries, the thread count, the versions.

Printed at the top of every benchmark so a table can be read against the machine that produced it
(the project's machines differ from session to session, and are often shared).
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
from pathlib import Path

PEERS = (
    "torch",
    "numpy",
    "faster-whisper",
    "ctranslate2",
    "openai-whisper",
    "pywhispercpp",
    "openvino-genai",
)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def cpu_features() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    return " ".join(f for f in wanted if f in flags)


def blas() -> str:
    """The BLAS each library multiplies with: PyTorch's (MKL / oneDNN) and NumPy's (OpenBLAS ...)."""
    import numpy as np
    import torch

    config = torch.__config__.show()
    items = [i.strip() for i in config.replace("\n", ",").split(",")]
    parts = [f"torch {i[i.index('BLAS_INFO') :]}" for i in items if "BLAS_INFO=" in i]
    parts += [f"torch {i.split(' for ')[0]}" for i in items if "Math Kernel Library Version" in i]
    parts.append(
        f"torch mkl={torch.backends.mkl.is_available()} mkldnn={torch.backends.mkldnn.is_available()}"
    )
    try:
        info = np.__config__.CONFIG["Build Dependencies"]["blas"]
        parts.append(f"numpy {info.get('name')} {info.get('version')}")
    except (AttributeError, KeyError, TypeError):
        parts.append("numpy blas unknown")
    return "; ".join(parts)


def versions() -> str:
    found = []
    for name in PEERS:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (uncommitted changes)" if dirty else "")


def describe(threads: int) -> str:
    """A few lines naming the machine, libraries and code a run measured."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return "\n".join(
        [
            f"cpu: {cpu_model()} ({os.cpu_count()} logical CPUs; {cpu_features()}); threads used: {threads}; "
            f"load average at start: {load:.1f}",
            f"blas: {blas()}",
            f"versions: {versions()}",
            f"whisperkv commit: {commit()}",
        ]
    )
