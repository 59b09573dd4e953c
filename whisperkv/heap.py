"""Keep the blocks a window's encoder frees in the process heap, for the next window to reuse.

Why: one 30 s window's encoder allocates and frees tens of megabytes of activations, tensors of 2-12 MB
each (1,500 positions by 384-2,048 values). glibc hands blocks that large back to the kernel (each one
mmap-ed and unmapped, or the heap's top trimmed), so the next window takes the same memory again page by
page: 20,000-34,000 minor page faults a window on tiny.en, about 40 ms of a 0.4 s transcription of an
11 s clip (round 13, measured with ``resource.getrusage``). CTranslate2 avoids this with its own caching
allocator. Here two glibc settings do it: blocks up to glibc's 32 MB ceiling come from the heap (not
mmap), and up to 256 MB of free heap top is kept instead of trimmed. A repeated transcription of that
clip then faults 0-1 pages (a lone second encoder pass about 560, against 5,300).

These are process-wide settings (like ``torch.set_num_threads``): ``load_model`` applies them for CPU
models, once the weights are loaded. Applied before, the loader's transient copies stayed in the heap:
the int8 model's load peaked at 584 against 546 MB (round 14), over faster-whisper int8's peak on a
short clip. After, the peaks are the same within a few MB. ``WHISPERKV_HEAP=system`` leaves
glibc's defaults (the benchmark's twin). Elsewhere (no glibc:
macOS, musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import os

#: glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: blocks this large or smaller come from the heap: glibc's ceiling for the mmap threshold (64-bit)
MMAP_THRESHOLD = 32 << 20
#: free memory at the heap's top kept for reuse before glibc gives it back
TRIM_THRESHOLD = 256 << 20
#: the environment variable that keeps glibc's defaults
OPT_OUT = "WHISPERKV_HEAP"


def keep_freed_blocks() -> bool:
    """Set glibc's mmap and trim thresholds (above) unless ``WHISPERKV_HEAP=system``; idempotent.

    Returns whether both settings took (False: opted out, or not glibc)."""
    if os.environ.get(OPT_OUT, "").lower() == "system":
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def _mallopt():  # noqa: ANN202 - a ctypes function or None
    """glibc's ``mallopt``, or None where the C library has none (it is glibc's own extension)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt


def give_back_free_memory() -> bool:
    """glibc's ``malloc_trim(0)``: every arena's free memory back to the kernel; False where there is none.

    Why: the settings above are right while windows follow each other, but they also keep the heap at
    its peak once work stops. A server that served 16 requests at once held 1,134 MB with none in flight,
    against 734 MB after its first 50 (round 22, ``benchmarks/serve.py``): its peak, kept, not a leak
    (within 8 MB from the 550th request to the 1,000th). The scheduler calls this once it has been idle
    a while (``Scheduler(idle_trim_s=...)``); the first window after it faults its pages in again, once."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    trim(0)
    return True
