"""The batched mode's windows in time order, so its memory stays flat in the recording's length.

A window whose decoder stopped early has its rest decoded again. Queued behind every chunk of the file,
that rest was decoded minutes of audio later: the file was decoded again from its start to reach it
(each time), and its segments could only be shown at the very end. Here the windows wait in a heap
by start (``WindowQueue``): each batch takes the earliest, so a rest joins the next batch, the audio is
read forward once (``ForwardSamples`` keeps only the samples of the windows still to decode),
and a chunk's segments are final as soon as its last window is decoded (``SegmentPrinter`` shows them
then, in time order, as ``transcribe``'s ``verbose`` does).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass, field

import torch
import tqdm

from whisperkv.chunking import Chunk


@dataclass(order=True)
class Pending:
    """A window to decode: ``chunk`` from sample ``seek``, the ``done``-th window of chunk ``origin``."""

    seek: int
    order: int  # ties: first queued, first decoded
    chunk: Chunk = field(compare=False)
    done: int = field(compare=False)
    origin: int = field(compare=False)  # which of the detector's chunks it belongs to


class WindowQueue:
    """Windows to decode, earliest first; counts each chunk's windows still queued or decoding."""

    def __init__(self, chunks: list[Chunk]) -> None:
        self._heap: list[Pending] = []
        self._queued = 0
        self.open: Counter[int] = Counter()  # origin -> windows not yet taken back by ``done``
        for origin, chunk in enumerate(chunks):
            self.push(chunk, chunk.start, 0, origin)

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, chunk: Chunk, seek: int, done: int, origin: int) -> None:
        heapq.heappush(self._heap, Pending(seek, self._queued, chunk, done, origin))
        self._queued += 1
        self.open[origin] += 1

    def take_batch(self, batch_size: int) -> list[Pending]:
        """The earliest windows, as many as make equal batches of the queue (14 windows at batch_size
        8: 7 + 7, not 8 + 6: a batch takes as many steps as its longest window, so a small last batch
        would pay nearly a full batch's steps for few windows)."""
        size = math.ceil(len(self._heap) / math.ceil(len(self._heap) / batch_size))
        return [heapq.heappop(self._heap) for _ in range(size)]

    def ranges(self, window_samples: int) -> list[tuple[int, int]]:
        """[start, stop) of every queued window (a window runs to its chunk's end, at most
        ``window_samples``)."""
        return [(p.seek, min(p.chunk.end, p.seek + window_samples)) for p in self._heap]

    def done(self, pending: Pending) -> None:
        """One window of ``pending.origin`` decoded (its follow-ups, if any, were pushed before)."""
        self.open[pending.origin] -= 1


class ForwardSamples:
    """An audio source read forward once, keeping only the samples of windows still to decode.

    The source itself keeps about a minute behind its latest read; a batch spans up to ``batch_size``
    windows of 30 s, and a request behind what it kept would decode the file again from its start. The
    silence between two chunks is not kept (nor read, when the source can skip it)."""

    def __init__(self, source) -> None:
        self.source = source
        self.spans: list[tuple[int, torch.Tensor]] = []  # (first sample, samples), in order, disjoint
        self.read_to = 0  # every sample before this was read (kept, or forgotten)

    def samples(self, start: int, stop: int) -> torch.Tensor:
        stop = max(start, stop)
        if stop > self.read_to:
            first = max(start, self.read_to)  # a gap since the last read is skipped
            more = self.source.samples(first, stop)
            if len(more):
                self.spans.append((first, more))
            self.read_to = max(self.read_to, first + len(more))
        stop = min(stop, self.read_to)
        parts, at = [], start
        for first, span in self.spans:
            if at >= stop:
                break
            if first <= at < first + len(span):
                piece = span[at - first : stop - first]
                parts.append(piece)
                at += len(piece)
        if at < stop:  # forgotten or skipped (the batched loop does not ask): the source has it
            return self.source.samples(start, stop)
        if not parts:  # past the end of the audio
            return torch.zeros(0)
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def keep_only(self, ranges: list[tuple[int, int]]) -> None:
        """Forget every sample outside ``ranges`` ([start, stop) of the windows still to decode): what
        was read and is not in one of them is never asked for again."""
        kept = []
        for first, span in self.spans:
            last = first + len(span)
            for start, stop in sorted(ranges):
                lo, hi = max(first, start), min(last, stop)
                if lo < hi:  # a copy: a view would keep the whole span's storage
                    kept.append((lo, span[lo - first : hi - first].clone()))
        merged: list[tuple[int, torch.Tensor]] = []
        for first, span in sorted(kept, key=lambda item: item[0]):  # overlapping ranges: keep one copy
            if merged and first < merged[-1][0] + len(merged[-1][1]):
                prev_first, prev = merged[-1]
                end = first + len(span)
                if end > prev_first + len(prev):
                    merged[-1] = (prev_first, torch.cat([prev, span[prev_first + len(prev) - first :]]))
                continue
            merged.append((first, span))
        self.spans = merged


class SegmentPrinter:
    """``[00:01.000 --> 00:04.000] text`` for each segment once its chunk is final, in time order."""

    def __init__(self, enabled: bool, bar: tqdm.tqdm, chunks: int) -> None:
        self.enabled = enabled
        self.bar = bar
        self.chunks = chunks
        self.next = 0  # the first chunk not yet shown
        self.decided: dict[int, list[dict]] = {}

    def add(self, origin: int, segments: list[dict]) -> None:
        if self.enabled:
            self.decided.setdefault(origin, []).extend(segments)

    def show_final(self, queue: WindowQueue) -> None:
        """Print every chunk, in order, whose windows are all decoded."""
        from whisperkv.writers import format_timestamp

        while self.next < self.chunks and queue.open[self.next] == 0:
            for segment in sorted(self.decided.pop(self.next, []), key=lambda s: (s["start"], s["end"])):
                start, end = format_timestamp(segment["start"]), format_timestamp(segment["end"])
                self.bar.write(f"[{start} --> {end}] {segment['text']}")
            self.next += 1
