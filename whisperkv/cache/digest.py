"""Content digests of tensors: what cache provenance and the weights digest are made of.

Why this shape: a digest is paid on every load (every weight, 3.2 GB for large-v3-turbo's float32) and
on every encoder output handed to ``decode`` (7.7 MB at turbo's width), so it is made fast where
it can be without depending on the machine. A tensor's bytes are cut into pieces of ``PIECE`` bytes,
each piece hashed with SHA-256 (which x86 CPUs with SHA extensions and ARMv8 run in hardware: 1.47 GB/s
against BLAKE2b's 0.51 on a Zen 3 core), a few pieces at a time on up to ``THREADS`` threads
(``hashlib`` lets go of the GIL for long inputs), and the digest is SHA-256 of the header and the
pieces' digests in order. The pieces' boundaries depend only on the tensor, never on the thread count,
so every machine and setting gives the same digest (the two sides of ``boundary/`` compare them).

The threads only hash: anything allocated is allocated by the calling thread. A float32 piece widened on
a helper thread came from that thread's own glibc arena, and a large-v3-turbo load then held 55 MB more
after it, and 80 MB more once a window was decoded (measured with ``VmRSS``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

PIECE = 1 << 20  # bytes hashed on their own (a float32 piece is PIECE // 4 numbers)
DIGEST_BYTES = 12  # the hex digest is 24 characters
GROUP = 4  # pieces widened at once per thread
#: at most this many hashing threads, whatever ``torch.get_num_threads()`` says: a float16 table's two
#: widening buffers are 2 x GROUP x threads pieces (32 MiB at 4), and each thread hashes ~1.5 GB/s
THREADS = 4


def tensor_digest(tensor: torch.Tensor, widen_float16: bool = False) -> str:
    """A short content digest of a tensor: its bytes, dtype and shape. ``widen_float16``: a float16
    tensor gets the digest of its exact float32 widening, widened a few pieces at a time, so no float32
    copy of a whole table is made (``cpu/quantize.py``: the int8 load's peak)."""
    t = tensor.detach().to("cpu").contiguous()
    flat = t.reshape(-1)
    widen = widen_float16 and t.dtype == torch.float16
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bytes, read as int16
        flat = flat.view(torch.int16)
    h = hashlib.sha256(f"{torch.float32 if widen else t.dtype}{tuple(t.shape)}".encode())
    pieces = -(-flat.numel() * (4 if widen else flat.element_size()) // PIECE)
    workers = max(1, min(torch.get_num_threads(), pieces, THREADS))
    for digest in _hashed(_groups(flat, widen, GROUP * workers), workers):
        h.update(digest)
    return h.hexdigest()[: 2 * DIGEST_BYTES]


def combine(parts: list[str]) -> str:
    """One digest of several (names and digests of a state dict, ``model/whisper.py``), each part ended
    by a NUL byte, so no two lists of parts without one (names, hex digests) read as the same bytes."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\0")
    return h.hexdigest()[: 2 * DIGEST_BYTES]


def _groups(flat: torch.Tensor, widen: bool, size: int) -> Iterator[list[memoryview]]:
    """``flat``'s bytes as pieces of ``PIECE`` bytes: all in one group, or, when ``widen``, widened to
    float32 here (on this thread, see above) ``size`` pieces a group."""
    if widen:  # into two buffers in turn: one hashed while the other is filled, none allocated again
        step = PIECE // 4
        buffers = [torch.empty(min(flat.numel(), step * size)) for _ in range(2)]
        for turn, start in enumerate(range(0, flat.numel(), step * size)):
            part = flat[start : start + step * size]
            wide = buffers[turn % 2][: part.numel()].copy_(part).numpy()
            yield [_bytes(wide[i : i + step]) for i in range(0, wide.size, step)]
        return
    data = _bytes(flat.numpy())  # hashed in place, no copy: one group
    yield [data[i : i + PIECE] for i in range(0, len(data), PIECE)]


def _hashed(groups: Iterator[list[memoryview]], workers: int) -> Iterator[bytes]:
    """The pieces' digests in order: on this thread alone, or on ``workers`` threads, the next group
    made (widened) while the last one hashes."""
    if workers == 1:
        yield from (_piece_digest(piece) for group in groups for piece in group)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="whisperkv-digest") as pool:
        hashing: list[Future[bytes]] = []
        for group in groups:
            hashing, done = [pool.submit(_piece_digest, piece) for piece in group], hashing
            yield from (future.result() for future in done)  # their buffer is then filled again
        yield from (future.result() for future in hashing)


def _bytes(array: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(array)).cast("B")


def _piece_digest(piece: memoryview) -> bytes:
    return hashlib.sha256(piece).digest()
