"""The C kernels' one library: its sources, flags, build on first use, and cache (``cpu/kernels/``).

Why built here, on first use: ``-march=native`` for the CPU it runs on, and a C compiler is all it
needs (no Python headers). Every kernel of the backend is in it (attention, float32 and int8 linears,
whole block and decoder steps, top k, greedy choice, the Self-KV reorder, the AMX encoder tiles): one
build, one cache entry, kept under a name that hashes the sources, the flags and the CPU, so one build
serves every later process. A machine without a compiler gets None: the step plan then keeps PyTorch's
paths (``cpu/plan.py``). It links the OpenMP runtime PyTorch has already loaded (``libgomp.so.1``): one
thread pool, ``torch.set_num_threads`` applies.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from whisperkv.cpu.flags import cpu_flags

#: compiled together into one library: the step attention, the int8 linears' rows (``cpu/int8_rows.py``),
#: beam search's top k (``decoding/top_k.py``), the float32 step's linears (``cpu/step_rows.py``) and a
#: block's whole step (``cpu/block_step.py``), and the int8 type's (``cpu/int8_step.py``), and the beam
#: step's Self-KV reorder (``cpu/reorder.py``), and the int8 type's encoder attention in AMX tiles
#: (``cpu/tiled_attention.py``) and linears (``cpu/tiled_linear.py``), and a greedy step's filters
#: and token choice (``decoding/greedy_choice.py``), and the bfloat16 type's linears and steps
#: (``cpu/bf16_linear.py``, ``cpu/bf16_step.py``) and its encoder's attention without AMX
#: (``cpu/dot_attention.py``), and the int8 type's encoder attention on AVX2 alone
#: (``cpu/int16_attention.py``), and word timing's dynamic time warping (``cpu/dtw.py``)
SOURCES = tuple(
    Path(__file__).with_name("kernels") / name
    for name in ("attend.c", "int8_rows.c", "top_k.c", "rows_f32.c", "block_step.c")
    + ("int8_block_step.c", "reorder.c", "encoder_attend.c", "encoder_linear.c", "greedy_choice.c")
    + ("bf16_rows.c", "bf16_block_step.c", "encoder_attend_dot.c", "encoder_attend_int16.c", "dtw.c")
)
#: what the sources include: part of the built library's name, so a change to it rebuilds
HEADERS = tuple(
    Path(__file__).with_name("kernels") / name for name in ("amx.h", "avx512_math.h", "int8_avx2.h")
)
#: ``-mprefer-vector-width=512``: gcc vectorises the plain C loops (a softmax's sums, the twins' dot
#: products) 512 bits wide on every AVX-512 CPU. Without it the width followed what ``-march=native``
#: named the CPU: a VM whose CPU gcc 12 took for a Rocket Lake got 256-bit loops (its tuning), one it did
#: not know got 512 (the generic tuning), and the attention kernel's register loops, written in the
#: order of the 512-bit plain loops, no longer gave their bits on the first (round 21).
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp", "-fPIC")
#: the link, without ``-ffast-math``: with it gcc 12 links ``crtfastmath.o`` into the library, whose start-up
#: code flushes denormal floats to zero for the whole process that loads it (the user's PyTorch and NumPy
#: included). The sources keep fast-math's code; only that process-wide side effect goes.
LINK_FLAGS = ("-shared", "-fopenmp")


@dataclass(frozen=True)
class Library:
    """The loaded library and where it was built."""

    library: ctypes.CDLL
    path: Path


def cache_dir() -> Path:
    """Where built kernels are kept: ``$WHISPERKV_CACHE``, else ``$XDG_CACHE_HOME/whisperkv``."""
    if os.environ.get("WHISPERKV_CACHE"):
        return Path(os.environ["WHISPERKV_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "whisperkv"


def _cpu_id() -> str:
    return " ".join(sorted(cpu_flags()))  # the flags -march=native builds for


@functools.cache
def load_library(directory: Path | None = None) -> Library | None:
    """The kernels' library built for this CPU (now, if it is not in ``directory`` yet), or None when
    no C compiler is found or the build fails (with a warning): the callers then keep PyTorch's paths.

    Without ``directory``: the cache directory, or the system's temporary one where that cannot be
    written (a read-only home)."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None or not all(source.is_file() for source in SOURCES + HEADERS):
        return None
    sources = b"".join(source.read_bytes() for source in SOURCES + HEADERS)
    flags = " ".join(FLAGS + LINK_FLAGS).encode()
    key = hashlib.sha256(sources + flags + _cpu_id().encode() + compiler.encode())
    name = f"kernels-{key.hexdigest()[:16]}.so"
    places = (
        [directory] if directory else [cache_dir(), Path(tempfile.gettempdir()) / f"whisperkv-{os.getuid()}"]
    )
    failure = ""
    for place in places:
        try:
            return Library(ctypes.CDLL(str(_build(compiler, place / name))), place / name)
        except subprocess.CalledProcessError as err:  # the compiler refused: another place will not help
            lines = err.stderr.decode(errors="replace").strip().splitlines()
            failure = lines[-1] if lines else f"{Path(compiler).name} exited with status {err.returncode}"
            break
        except (OSError, subprocess.SubprocessError) as err:
            failure = str(err)
    warnings.warn(
        f"the C kernels (decoder steps' attention, float32 and int8 linears, beam search's top k, a "
        f"greedy step's token choice) were not built ({failure}); using PyTorch's attention, row "
        f"GEMMs, quantized linears, topk and tensor operations",
        stacklevel=2,
    )
    return None


def _build(compiler: str, path: Path) -> Path:
    """``path``, compiled now unless it is there already; atomic, so a concurrent build is harmless."""
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            built = compile_library(compiler, Path(tmp) / path.name)
            os.replace(built, path)
    return path


def compile_library(
    compiler: str, path: Path, flags: tuple[str, ...] = FLAGS, sources: tuple[Path, ...] = SOURCES
) -> Path:
    """``sources`` compiled with ``flags`` into objects beside ``path``, then linked (``LINK_FLAGS``)
    into ``path``. Also how the tests build a variant (other flags, one source) to compare with the
    library: linked this way, loading it leaves the process's floating-point state alone too."""
    objects = [str(path.with_name(f"{path.stem}-{source.stem}.o")) for source in sources]
    commands = [[compiler, *flags, "-c", str(source), "-o", obj] for source, obj in zip(sources, objects)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # one compiler per core
        for done in pool.map(
            lambda command: subprocess.run(command, capture_output=True, timeout=120), commands
        ):
            done.check_returncode()
    link = [compiler, *LINK_FLAGS, *objects, "-o", str(path), "-lm"]
    subprocess.run(link, check=True, capture_output=True, timeout=120)
    return path
