"""``vad_filter``: keep only the speech silero-vad hears, transcribe it, give times on the original audio.

The speech chunks come from silero-vad's own ``get_speech_timestamps`` (the model whisperkv's streaming
already loads, ``whisperkv.stream.vad``) with faster-whisper's ``VadOptions``; they are joined end to
end, and every time the transcription reports on the joined audio is moved back by the silence that was
cut before it. A word's two ends are moved by the same chunk's offset (the chunk its middle falls in),
so no word straddles a cut.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import asdict, fields

import numpy as np
import torch

from whisperkv.audio import SAMPLE_RATE
from whisperkv.faster.types import Segment, VadOptions


def vad_options(parameters: dict | VadOptions | None, **overrides: float) -> VadOptions:
    """``vad_parameters`` as faster-whisper takes them (None, a dict or ``VadOptions``), checked."""
    if parameters is None:
        options = VadOptions(**overrides)
    elif isinstance(parameters, VadOptions):
        options = VadOptions(**{**asdict(parameters), **overrides})
    elif isinstance(parameters, dict):
        known = {f.name for f in fields(VadOptions)}
        unknown = sorted(set(parameters) - known)
        if unknown:
            raise ValueError(
                f"unknown vad_parameters {', '.join(map(repr, unknown))}: {', '.join(sorted(known))}"
            )
        options = VadOptions(**{**parameters, **overrides})
    else:
        raise ValueError(f"vad_parameters must be a dict or VadOptions, got {type(parameters).__name__}")
    if not 0 < options.threshold < 1:
        raise ValueError(f"vad threshold must be between 0 and 1, got {options.threshold}")
    if min(options.min_speech_duration_ms, options.min_silence_duration_ms, options.speech_pad_ms) < 0:
        raise ValueError("vad durations must not be negative")
    return options


def speech_chunks(audio: np.ndarray, options: VadOptions) -> list[dict]:
    """[{"start": sample, "end": sample}, ...] where silero-vad hears speech."""
    from whisperkv.stream.vad import load_vad_model, silero

    if len(audio) == 0:
        return []
    return silero().get_speech_timestamps(
        torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)),
        load_vad_model(),
        threshold=options.threshold,
        neg_threshold=options.neg_threshold,
        sampling_rate=SAMPLE_RATE,
        min_speech_duration_ms=options.min_speech_duration_ms,
        max_speech_duration_s=options.max_speech_duration_s,
        min_silence_duration_ms=options.min_silence_duration_ms,
        speech_pad_ms=options.speech_pad_ms,
    )


def join_chunks(audio: np.ndarray, chunks: list[dict]) -> np.ndarray:
    """The speech alone, chunk after chunk (empty when nothing was heard)."""
    if not chunks:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([audio[c["start"] : c["end"]] for c in chunks]).astype(np.float32, copy=False)


class SpeechTimeMap:
    """Times on the joined speech → times on the original audio."""

    def __init__(self, chunks: list[dict]) -> None:
        self.joined_ends: list[int] = []  # where each chunk ends on the joined audio (samples)
        self.silence_before: list[float] = []  # seconds cut before each chunk
        cut = previous_end = 0
        for chunk in chunks:
            cut += chunk["start"] - previous_end
            previous_end = chunk["end"]
            self.joined_ends.append(chunk["end"] - cut)
            self.silence_before.append(cut / SAMPLE_RATE)

    def chunk_of(self, time: float, is_end: bool = False) -> int:
        sample = int(time * SAMPLE_RATE)
        if is_end and sample in self.joined_ends:
            return self.joined_ends.index(sample)  # a segment ending exactly where its chunk ends
        return min(bisect.bisect(self.joined_ends, sample), len(self.joined_ends) - 1)

    def original(self, time: float, chunk: int | None = None, is_end: bool = False) -> float:
        index = self.chunk_of(time, is_end) if chunk is None else chunk
        return round(self.silence_before[index] + time, 2)


def restore_times(segments: Iterable[Segment], chunks: list[dict]) -> Iterator[Segment]:
    """The segments (lazily) with their and their words' times on the original audio."""
    times = SpeechTimeMap(chunks)
    for segment in segments:
        if segment.words:
            for word in segment.words:
                chunk = times.chunk_of((word.start + word.end) / 2)
                word.start, word.end = times.original(word.start, chunk), times.original(word.end, chunk)
            segment.start, segment.end = segment.words[0].start, segment.words[-1].end
        else:
            segment.start = times.original(segment.start)
            segment.end = times.original(segment.end, is_end=True)
        yield segment
