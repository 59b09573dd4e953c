"""Long-form transcription: slide 30 s windows over the audio, decode each, stitch segments.

For each window (``seek`` is its first Mel frame):
1. encode the window once (the store keeps its encoder output and Cross-KV by provenance);
2. decode with temperature fallback — every retry reuses that encoder output and Cross-KV;
3. skip it if it is silence: digital silence before decoding, or afterwards a high no-speech
   probability with a low log-probability;
4. cut the tokens into segments at timestamp pairs, and advance ``seek`` to the last complete
   timestamp (or the whole window when it ended with a lone timestamp / none);
5. optionally align words (cross-attention + DTW), and drop hallucinations in silences.
The previous windows' text is the next window's prompt unless a window needed temperature > 0.5.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import tqdm

from whisperkv.audio import (
    FRAMES_PER_SECOND,
    HOP_LENGTH,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    pad_or_trim,
)
from whisperkv.audio_source import AudioSource, open_source
from whisperkv.cache.store import CacheStore, EncodedWindow, WindowEncoder
from whisperkv.decoding.decode import decode_window
from whisperkv.decoding.language import detect_language_from_features
from whisperkv.decoding.options import DecodingOptions, DecodingResult
from whisperkv.tokenizer import LANGUAGES

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer

#: Peak amplitude below which a window is digital silence (-80 dBFS): it is skipped without decoding,
#: because Whisper hallucinates short phrases ("You") on pure silence.
SILENCE_PEAK = 1e-4
PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"
DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


def decode_with_fallback(
    model: Whisper,
    tokenizer: Tokenizer,
    window: EncodedWindow,
    temperatures: Sequence[float],
    base: DecodingOptions,
    compression_ratio_threshold: float | None,
    logprob_threshold: float | None,
    no_speech_threshold: float | None,
    store: CacheStore,
) -> DecodingResult:
    """Decode at each temperature in turn until the result is neither repetitive nor improbable."""
    result: DecodingResult | None = None
    for i, t in enumerate(temperatures):
        if t > 0:
            options = replace(base, temperature=t, beam_size=None, patience=None)
        else:
            options = replace(base, temperature=t, best_of=None)
        if i > 0:
            store.hits.append(f"fallback retry at temperature {t}: encoder output and Cross-KV reused")
        result = decode_window(model, tokenizer, window.audio_features, options, cross_kv=window.cross_kv)
        needs_fallback = False
        if compression_ratio_threshold is not None and result.compression_ratio > compression_ratio_threshold:
            needs_fallback = True  # too repetitive
        if logprob_threshold is not None and result.avg_logprob < logprob_threshold:
            needs_fallback = True  # too improbable
        if (
            no_speech_threshold is not None
            and result.no_speech_prob > no_speech_threshold
            and logprob_threshold is not None
            and result.avg_logprob < logprob_threshold
        ):
            needs_fallback = False  # silence: retrying will not help
        if not needs_fallback:
            break
    assert result is not None
    return result


def transcribe(
    model: Whisper,
    audio: str | os.PathLike | np.ndarray | torch.Tensor | AudioSource,
    *,
    verbose: bool | None = None,
    temperature: float | Sequence[float] = DEFAULT_TEMPERATURES,
    compression_ratio_threshold: float | None = 2.4,
    logprob_threshold: float | None = -1.0,
    no_speech_threshold: float | None = 0.6,
    condition_on_previous_text: bool = True,
    initial_prompt: str | None = None,
    carry_initial_prompt: bool = False,
    word_timestamps: bool = False,
    prepend_punctuations: str = "\"'“¿([{-",
    append_punctuations: str = "\"'.。,，!！?？:：”)]}、",
    clip_timestamps: str | list[float] = "0",
    hallucination_silence_threshold: float | None = None,
    encoder: WindowEncoder | None = None,  # boundary (issue 11): e.g. RemoteEncoder(url, secret, carry)
    **decode_options: Any,
) -> dict:
    """Transcribe a file or a 16 kHz float32 waveform. Options and result as in openai-whisper."""
    source = open_source(audio, model.dims.n_mels)
    decode_options.pop("fp16", None)  # precision is the model's dtype
    content_frames = source.content_frames
    content_duration = float(content_frames * HOP_LENGTH / SAMPLE_RATE)
    store = CacheStore(max_entries=2, encoder=encoder)  # boundary; the window being decoded + language window

    language_probs = None
    if decode_options.get("language") is None:
        if not model.is_multilingual:
            decode_options["language"] = "en"
        else:
            first = store.encode(
                model, pad_or_trim(source.mel(0, N_FRAMES), N_FRAMES), 0, N_SAMPLES, "language detection"
            )
            decode_options["language"], language_probs = detect_language_from_features(
                model, first.audio_features
            )
            if verbose is not None:
                print(f"Detected language: {LANGUAGES[decode_options['language']].title()}")
    task = decode_options.get("task", "transcribe")
    tokenizer = model.tokenizer.with_options(language=decode_options["language"], task=task)
    language = tokenizer.language or "en"
    decode_options["language"] = language
    base = DecodingOptions(**decode_options)
    temperatures = [temperature] if isinstance(temperature, (int, float)) else list(temperature)

    if isinstance(clip_timestamps, str):
        clip_timestamps = [float(ts) for ts in clip_timestamps.split(",") if ts.strip()]
    seek_points = [round(ts * FRAMES_PER_SECOND) for ts in clip_timestamps] or [0]
    if len(seek_points) % 2 == 1:
        seek_points.append(content_frames)
    seek_clips = list(zip(seek_points[::2], seek_points[1::2]))

    if word_timestamps and task == "translate":
        warnings.warn("Word-level timestamps on translations may not be reliable.", stacklevel=2)

    input_stride = N_FRAMES // model.dims.n_audio_ctx  # Mel frames per encoder position: 2
    time_precision = input_stride * HOP_LENGTH / SAMPLE_RATE  # seconds per timestamp step: 0.02

    all_tokens: list[int] = []
    all_segments: list[dict] = []
    prompt_reset_since = 0
    remaining_prompt_length = model.dims.n_text_ctx // 2 - 1
    initial_prompt_tokens: list[int] = []
    if initial_prompt is not None:
        initial_prompt_tokens = tokenizer.encode(" " + initial_prompt.strip())
        all_tokens.extend(initial_prompt_tokens)
        remaining_prompt_length -= len(initial_prompt_tokens)
    last_cache_report: dict | None = None

    clip_idx = 0
    seek = seek_clips[0][0]
    last_speech_timestamp = 0.0
    # progress in seconds of audio, on a terminal, when verbose (the CLI default); verbose=False silences it
    show_progress = verbose is True and sys.stderr.isatty()
    bar = tqdm.tqdm(
        total=round(content_duration, 2), unit="s", unit_scale=False, disable=not show_progress, leave=False
    )
    with bar as pbar:
        while clip_idx < len(seek_clips):
            clip_start, clip_end = seek_clips[clip_idx]
            seek = max(seek, clip_start)
            if seek >= clip_end:
                clip_idx += 1
                if clip_idx < len(seek_clips):
                    seek = seek_clips[clip_idx][0]
                continue
            time_offset = float(seek * HOP_LENGTH / SAMPLE_RATE)
            window_end_time = float((seek + N_FRAMES) * HOP_LENGTH / SAMPLE_RATE)
            segment_size = min(N_FRAMES, content_frames - seek, clip_end - seek)
            segment_duration = segment_size * HOP_LENGTH / SAMPLE_RATE
            samples = source.samples(seek * HOP_LENGTH, (seek + segment_size) * HOP_LENGTH)
            if samples.numel() == 0 or float(samples.abs().max()) < SILENCE_PEAK:
                pbar.update(segment_size / FRAMES_PER_SECOND)
                seek += segment_size  # nothing was said here: no decode, no hallucination
                continue
            mel_segment = pad_or_trim(source.mel(seek, seek + segment_size), N_FRAMES)
            window = store.encode(
                model, mel_segment, seek * HOP_LENGTH, (seek + segment_size) * HOP_LENGTH, "same window"
            )

            if carry_initial_prompt:
                ignored = max(len(initial_prompt_tokens), prompt_reset_since)
                prompt = initial_prompt_tokens + all_tokens[ignored:][-remaining_prompt_length:]
            else:
                prompt = all_tokens[prompt_reset_since:]
            result = decode_with_fallback(
                model,
                tokenizer,
                window,
                temperatures,
                replace(base, prompt=prompt),
                compression_ratio_threshold,
                logprob_threshold,
                no_speech_threshold,
                store,
            )
            store.record_decode(window, result)  # boundary: decode ms and tokens per window
            last_cache_report = result.cache
            tokens = torch.tensor(result.tokens, dtype=torch.long)

            if no_speech_threshold is not None:
                should_skip = result.no_speech_prob > no_speech_threshold
                if logprob_threshold is not None and result.avg_logprob > logprob_threshold:
                    should_skip = False  # confident text despite the no-speech score
                if should_skip:
                    pbar.update((min(content_frames, seek + segment_size) - seek) / FRAMES_PER_SECOND)
                    seek += segment_size
                    continue

            previous_seek = seek
            current_segments: list[dict] = []

            def new_segment(
                start: float, end: float, seg_tokens: torch.Tensor, result=result, seek=seek
            ) -> dict:
                ids = seg_tokens.tolist()
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

            is_ts = tokens.ge(tokenizer.timestamp_begin)
            single_timestamp_ending = is_ts[-2:].tolist() == [False, True]
            consecutive = (torch.where(is_ts[:-1] & is_ts[1:])[0] + 1).tolist()
            if consecutive:
                slices = consecutive + ([len(tokens)] if single_timestamp_ending else [])
                last_slice = 0
                for current_slice in slices:
                    piece = tokens[last_slice:current_slice]
                    start_pos = piece[0].item() - tokenizer.timestamp_begin
                    end_pos = piece[-1].item() - tokenizer.timestamp_begin
                    current_segments.append(
                        new_segment(
                            time_offset + start_pos * time_precision,
                            time_offset + end_pos * time_precision,
                            piece,
                        )
                    )
                    last_slice = current_slice
                if single_timestamp_ending:
                    seek += segment_size  # no speech after the last timestamp: take the whole window
                else:
                    last_pos = tokens[last_slice - 1].item() - tokenizer.timestamp_begin
                    seek += last_pos * input_stride  # resume at the last complete segment's end
            else:
                duration = segment_duration
                stamps = tokens[is_ts]
                if len(stamps) > 0 and stamps[-1].item() != tokenizer.timestamp_begin:
                    duration = (stamps[-1].item() - tokenizer.timestamp_begin) * time_precision
                current_segments.append(new_segment(time_offset, time_offset + duration, tokens))
                seek += segment_size

            if word_timestamps:
                from whisperkv.timing import (
                    add_word_timestamps,
                    get_end,
                    is_segment_anomaly,
                    next_words_segment,
                )

                add_word_timestamps(
                    segments=current_segments,
                    model=model,
                    tokenizer=tokenizer,
                    mel=mel_segment,
                    num_frames=segment_size,
                    prepend_punctuations=prepend_punctuations,
                    append_punctuations=append_punctuations,
                    last_speech_timestamp=last_speech_timestamp,
                    window=window,
                    store=store,
                )
                if not single_timestamp_ending:
                    last_word_end = get_end(current_segments)
                    if last_word_end is not None and last_word_end > time_offset:
                        seek = round(last_word_end * FRAMES_PER_SECOND)
                if hallucination_silence_threshold is not None:
                    threshold = hallucination_silence_threshold
                    if not single_timestamp_ending:
                        last_word_end = get_end(current_segments)
                        if last_word_end is not None and last_word_end > time_offset:
                            remaining = window_end_time - last_word_end
                            if remaining > threshold:
                                seek = round(last_word_end * FRAMES_PER_SECOND)
                            else:
                                seek = previous_seek + segment_size
                    first_segment = next_words_segment(current_segments)
                    if first_segment is not None and is_segment_anomaly(first_segment, PUNCTUATION):
                        gap = first_segment["start"] - time_offset
                        if gap > threshold:
                            seek = previous_seek + round(gap * FRAMES_PER_SECOND)
                            continue
                    hal_last_end = last_speech_timestamp
                    for si in range(len(current_segments)):
                        segment = current_segments[si]
                        if not segment["words"]:
                            continue
                        if is_segment_anomaly(segment, PUNCTUATION):
                            next_segment = next_words_segment(current_segments[si + 1 :])
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
                                current_segments[si:] = []
                                break
                        hal_last_end = segment["end"]
                last_word_end = get_end(current_segments)
                if last_word_end is not None:
                    last_speech_timestamp = last_word_end

            if verbose:
                from whisperkv.writers import format_timestamp

                for segment in current_segments:
                    start, end = format_timestamp(segment["start"]), format_timestamp(segment["end"])
                    pbar.write(f"[{start} --> {end}] {segment['text']}")  # prints above the bar

            for segment in current_segments:
                if segment["start"] == segment["end"] or segment["text"].strip() == "":
                    segment["text"] = ""
                    segment["tokens"] = []
                    segment["words"] = []
            all_segments.extend(
                {"id": i, **s} for i, s in enumerate(current_segments, start=len(all_segments))
            )
            all_tokens.extend(t for s in current_segments for t in s["tokens"])
            if not condition_on_previous_text or result.temperature > 0.5:
                prompt_reset_since = len(all_tokens)
            pbar.update((min(content_frames, seek) - previous_seek) / FRAMES_PER_SECOND)

    output = {
        "text": tokenizer.decode(all_tokens[len(initial_prompt_tokens) :]),
        "segments": all_segments,
        "language": language,
    }
    if language_probs is not None:
        output["language_probs"] = language_probs
    output["cache"] = {**(last_cache_report or {}), "reuse": store.report()}
    output["costs"] = store.costs()  # boundary: per window, every stage's ms and the bytes that crossed
    return output
