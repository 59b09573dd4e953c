"""A checkpoint read through a memory map, and its pages handed back to the kernel once read.

Why: ``torch.load`` reads a ``.pt`` whole into anonymous memory, so a load held every stored tensor
until the last one was converted (large-v3-turbo's int8 type: its 1.6 GB of float16 beside the int8
weights being made, a 2.0-2.1 GB peak against CTranslate2's 837 MB). Loaded with ``mmap=True`` the
tensors are views of the file, paged in as they are read; once a tensor has been converted (widened,
fused, quantised, hashed), ``drop`` tells the kernel its pages may go. The map is private (checked, as
is that the range is the file's own map) and nothing writes into the checkpoint's tensors (every
conversion makes new ones), so its pages are clean file pages: dropping one costs at most a second read
from the page cache, never a value
(``tests/test_int8_load.py`` compares the tensors and tokens with the eagerly read file's).
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

#: madvise(2)'s "the pages may be freed" advice (the same value on every Linux architecture)
MADV_DONTNEED = 4


@dataclass(frozen=True)
class MappedPages:
    """The address range a memory-mapped checkpoint's tensors occupy, page-aligned, and one of those
    tensors, held so that the map outlives every advice given to it: once the checkpoint's last tensor
    is freed PyTorch unmaps the file, and a later allocation may be given the same addresses, which a
    whole-map ``drop`` would then wipe. With the anchor held the range stays the file's map (its pages
    dropped, so it costs address space, not memory) until this object goes."""

    start: int
    end: int
    anchor: torch.Tensor = field(repr=False, compare=False)

    @classmethod
    def of(cls, tensors: Iterable[object], path: str | Path) -> MappedPages | None:
        """The page-aligned range spanning these tensors' storages, if it lies inside one private map of
        the file ``path`` (``torch.load(mmap=True)`` maps the whole file once; checked in
        /proc/self/maps, so that nothing outside the file's own map is ever handed back); else None."""
        held = [t for t in tensors if isinstance(t, torch.Tensor) and t.numel()]
        if not held:
            return None
        spans = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in held]
        start = _page_floor(min(ptr for ptr, _ in spans))
        end = _page_ceil(max(ptr + size for ptr, size in spans))
        if not _inside_private_map(start, end, Path(path).resolve()):
            return None
        return cls(start, end, anchor=held[0].detach().view(-1)[:1])

    def drop(self, tensor: torch.Tensor | None = None) -> None:
        """Hand back the pages of ``tensor`` (those it touches, rounded out to whole pages), or of the
        whole map; a tensor outside the map (a converted one) is left alone."""
        if tensor is None:
            _madvise(self.start, self.end - self.start)
            return
        if not tensor.numel():
            return
        ptr = tensor.data_ptr()
        first, last = _page_floor(ptr), _page_ceil(ptr + tensor.numel() * tensor.element_size())
        if self.start <= first and last <= self.end:
            _madvise(first, last - first)


def _inside_private_map(start: int, end: int, path: Path) -> bool:
    """Whether [start, end) lies inside one private (copy-on-write) map of ``path`` in this process."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[5] != str(path) or not fields[1].endswith("p"):
            continue
        low, high = (int(bound, 16) for bound in fields[0].split("-"))
        if low <= start and end <= high:
            return True
    return False


def _page_floor(address: int) -> int:
    return address - address % mmap.PAGESIZE


def _page_ceil(address: int) -> int:
    return _page_floor(address + mmap.PAGESIZE - 1)


def _madvise(start: int, length: int) -> None:
    """``madvise(start, length, MADV_DONTNEED)``; nothing where the C library has no ``madvise``."""
    try:
        madvise = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    madvise(start, length, MADV_DONTNEED)
