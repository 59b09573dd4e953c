"""A worker process must not outlive the batch that started it.

A parent killed by SIGKILL runs no clean-up, so its spawned workers were re-parented to PID 1 and went on
transcribing, writing outputs that no ``results.jsonl`` line describes. Two guards: on Linux the kernel
kills the worker when its parent dies (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, asked for at start-up),
and everywhere a worker checks that its parent is still the one that started it before it takes a file
and before it writes (a worker whose parent is gone exits at once). Once every worker is gone the
multiprocessing resource tracker sees its pipe close and exits too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies; exit now if the parent already has.

    Returns whether the kernel guard is in place (Linux with a loadable libc), the polling check
    (``exit_if_orphaned``) being the guard elsewhere."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            armed = libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    exit_if_orphaned(parent_pid)  # the parent may have died before the guard was armed
    return armed


def exit_if_orphaned(parent_pid: int) -> None:
    """Exit at once, writing nothing, when the process that started this one is no longer its parent."""
    if os.getppid() != parent_pid:
        os._exit(1)
