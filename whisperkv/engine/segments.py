"""A decoded window's tokens → segments, and how far ``seek`` moves; plus the hallucination check.

Both follow openai-whisper's long-form loop step for step: segments are cut at consecutive timestamp
pairs; the window is consumed up to its last complete segment unless it ended on a lone timestamp
(no speech after it) or had no timestamp pair at all. With word timestamps, segments that look
hallucinated and sit in silence are dropped and ``seek`` resumes at their start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from whisperkv.audio import FRAMES_PER_SECOND
from whisperkv.timing import is_segment_anomaly, next_words_segment

if TYPE_CHECKING:
    from whisperkv.decoding.options import DecodingResult
    from whisperkv.tokenizer import Tokenizer

PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"


@dataclass
class WindowSegments:
    segments: list[dict]
    seek: int  # where the next window starts
    single_timestamp_ending: bool


def new_segment(
    tokenizer: Tokenizer, seek: int, start: float, end: float, ids: list[int], result: DecodingResult
) -> dict:
    return {
        "seek": seek,
        "start": start,
        "end": end,
        "text": tokenizer.decode([t for t in ids if t < tokenizer.eot]),
        "tokens": ids,
        "temperature": result.temperature,
        "avg_logprob": result.avg_logprob,
        "compression_ratio": result.compression_ratio,
        "no_speech_prob": result.no_speech_prob,
    }


def cut_segments(
    tokenizer: Tokenizer,
    result: DecodingResult,
    seek: int,
    segment_size: int,
    input_stride: int,
    time_precision: float,
) -> WindowSegments:
    """The window's segments and the next ``seek`` (in Mel frames)."""
    tokens = torch.tensor(result.tokens, dtype=torch.long)
    time_offset = float(seek * 160 / 16000)
    segment_duration = segment_size * 160 / 16000
    ts_begin = tokenizer.timestamp_begin
    segments: list[dict] = []
    is_ts = tokens.ge(ts_begin)
    single_timestamp_ending = is_ts[-2:].tolist() == [False, True]
    consecutive = (torch.where(is_ts[:-1] & is_ts[1:])[0] + 1).tolist()
    if consecutive:
        slices = consecutive + ([len(tokens)] if single_timestamp_ending else [])
        last_slice = 0
        for current_slice in slices:
            piece = tokens[last_slice:current_slice]
            start_pos = piece[0].item() - ts_begin
            end_pos = piece[-1].item() - ts_begin
            start, end = time_offset + start_pos * time_precision, time_offset + end_pos * time_precision
            segments.append(new_segment(tokenizer, seek, start, end, piece.tolist(), result))
            last_slice = current_slice
        if single_timestamp_ending:
            next_seek = seek + segment_size  # no speech after the last timestamp: take the whole window
        else:
            last_pos = tokens[last_slice - 1].item() - ts_begin
            next_seek = seek + last_pos * input_stride  # resume at the last complete segment's end
    else:
        duration = segment_duration
        stamps = tokens[is_ts]
        if len(stamps) > 0 and stamps[-1].item() != ts_begin:
            duration = (stamps[-1].item() - ts_begin) * time_precision
        segments.append(
            new_segment(tokenizer, seek, time_offset, time_offset + duration, tokens.tolist(), result)
        )
        next_seek = seek + segment_size
    return WindowSegments(segments, next_seek, single_timestamp_ending)


def drop_hallucinations(
    segments: list[dict],
    *,
    threshold: float,
    seek: int,
    previous_seek: int,
    segment_size: int,
    time_offset: float,
    window_end_time: float,
    content_duration: float,
    content_frames: int,
    last_speech_timestamp: float,
    single_timestamp_ending: bool,
    last_word_end: float | None,
) -> tuple[int, bool]:
    """Drop segments that look hallucinated in silence (in place); return (seek, redo_window).

    ``redo_window`` is true when the window's first words are an anomaly after a long gap: the window
    is decoded again from the gap, and none of its segments are kept.
    """
    segment_duration = segment_size * 160 / 16000
    if not single_timestamp_ending and last_word_end is not None and last_word_end > time_offset:
        remaining = window_end_time - last_word_end
        seek = (
            round(last_word_end * FRAMES_PER_SECOND)
            if remaining > threshold
            else previous_seek + segment_size
        )
    first_segment = next_words_segment(segments)
    if first_segment is not None and is_segment_anomaly(first_segment, PUNCTUATION):
        gap = first_segment["start"] - time_offset
        if gap > threshold:
            return previous_seek + round(gap * FRAMES_PER_SECOND), True
    hal_last_end = last_speech_timestamp
    for si in range(len(segments)):
        segment = segments[si]
        if not segment["words"]:
            continue
        if is_segment_anomaly(segment, PUNCTUATION):
            next_segment = next_words_segment(segments[si + 1 :])
            if next_segment is not None:
                hal_next_start = next_segment["words"][0]["start"]
            else:
                hal_next_start = time_offset + segment_duration
            silence_before = (
                segment["start"] - hal_last_end > threshold
                or segment["start"] < threshold
                or segment["start"] - time_offset < 2.0
            )
            silence_after = (
                hal_next_start - segment["end"] > threshold
                or is_segment_anomaly(next_segment, PUNCTUATION)
                or window_end_time - segment["end"] < 2.0
            )
            if silence_before and silence_after:
                seek = round(max(time_offset + 1, segment["start"]) * FRAMES_PER_SECOND)
                if content_duration - segment["end"] < threshold:
                    seek = content_frames
                segments[si:] = []
                break
        hal_last_end = segment["end"]
    return seek, False
