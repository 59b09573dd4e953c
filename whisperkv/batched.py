"""Batched long-form transcription: cut the audio at pauses into ≤ 30 s chunks, decode them together.

Sequential transcription decodes one window at a time, so every decoder step reads all the weights
for one row. Here the chunks of a file are independent (no previous-text prompt), so up to
``batch_size`` windows share each step: the encoder runs on a batch, each layer's Cross-KV holds one
row per window, and one decoder call advances every window by a token. Chunks come from a
voice-activity detector (``whisperkv.chunking``: ``energy`` or ``silero``).

Each chunk is read the way the sequential loop reads the whole file: decoded with timestamps, cut into
segments at timestamp pairs (real times: the window's start plus the predicted offsets), and when the
decoder stops before the chunk's end with speech after its last timestamp (by the detector), the rest
is decoded again as a new window from that timestamp, batched with the next windows. Windows finish
decoding at different steps; finished ones leave the batch. A window whose greedy result is repetitive
or improbable is redone alone with temperature fallback, as the sequential mode would, from its own row
of the batch's encoder output (not encoded again).

Why, measured (tiny.en greedy, the benchmark's 120.7 s of shuffled utterances with 0.3-3 s pauses):
chunks decoded once with timestamps had 21.0 % WER against 12.4 % sequential, for three reasons. Whisper
often ends a window's text one sentence early (trained on windows whose last sentence runs on into the
next): the words after the last timestamp were never decoded. Chunks were trimmed to their first and
last loud frame, so their edge words were clipped and dropped (the long file: 14.0 % -> 8.6 % WER from
0.3 s of padding alone). And cuts went in the latest 0.2 s pause, often a breath inside a sentence
(``whisperkv.chunking``). Without timestamps the decoder also skips whole utterances after a pause.

``benchmarks/bench.py --threads 1 --repeats 1 --engines whisperkv-fp32,whisperkv-int8,whisperkv-batched-
int8,whisperkv-batched-fp32,whisperkv-batched-int8-silero --audio utterances,long --modes greedy`` at
ff6e434 printed WER batched / sequential: utterances (180.5 s) int8 11.2 % / 14.8 %, float32 11.5 % /
12.4 %; long (389.3 s) int8 7.2 % / 7.3 %, float32 7.1 % / 8.1 %. The price: more windows (long 2.8 a
minute against 2.2 with one decode per chunk) and timestamp tokens. The same command run on a8f3056
(one segment per chunk, no timestamps): batched int8 11.4 s against 14.5 s here on the long file, with
6.7 % WER; utterances 5.1 s against 6.2 s, with 16.0 % WER.
``timestamps=False`` still decodes each chunk once without timestamps: one segment per chunk.

Beam search skips: on one chunk every beam-5 candidate kept only the sentence after a 2.8 s pause (the
greedy decoder kept both). A segment whose words span a detected pause of 2 s or more is therefore
decoded again as two windows split in that pause (``chunking.long_pause``). Utterances 120.7 s, int8
beam 5: 45/233 -> 30/233 word errors (sequential 28/233); greedy 27/233 unchanged.

End of text is held (``decoding.logit_filters.hold_end_of_text``): while the detector hears speech after
the text decoded so far (the rest rule above), the decoder may not end the window, unless it is sure
(end of text over 0.9: what the detector took for speech was breath or noise). The window it already
has goes on to the chunk's end, so the rest needs no second encoder pass and decode. Scratch A/B, tiny.en
int8, interleaved, medians of 3 (held / not held): utterances beam 5 2.33 / 2.55 s with 8 / 10 windows and
26 / 25 word errors, greedy 1.08 / 1.25 s (5 / 6 windows, 27 / 27); long beam 5 6.04 / 6.85 s (16 / 19
windows, 60 / 60 errors), greedy 3.95 / 3.92 (17 / 17, 62 / 62). base, medians of 2: utterances beam 5
3.28 / 3.81 s (26 / 24 errors: "all right" for "alright" counts 2), long beam 5 11.25 / 12.01 s (54 / 52).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import tqdm

from whisperkv.audio import HOP_LENGTH, SAMPLE_RATE
from whisperkv.audio_source import AudioSource, open_source
from whisperkv.batched_order import ForwardSamples, Pending, SegmentPrinter, WindowQueue
from whisperkv.cache.store import CacheStore, EncodedWindow
from whisperkv.chunking import (
    FRAME,
    VADS,
    Chunk,
    chunk_mel,
    chunks_from_speech,
    long_pause,
    silero_frames,
    speech_frames,
    split_at_silences,
    split_with_silero,
)
from whisperkv.decoding.decode import decode_windows
from whisperkv.decoding.language import detect_language_from_features
from whisperkv.decoding.options import DecodingOptions, DecodingResult
from whisperkv.engine.segments import cut_segments
from whisperkv.local_encoder import LocalEncoder
from whisperkv.tokenizer import LANGUAGES
from whisperkv.transcribe import DEFAULT_TEMPERATURES, decode_with_fallback

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer

__all__ = [
    "Chunk",
    "chunk_mel",
    "speech_frames",
    "split_at_silences",
    "split_with_silero",
    "transcribe_batched",
    "window_segments",
]

TIME_PRECISION = 0.02  # seconds per timestamp token
MIN_REST_SPEECH = 5  # 20 ms speech frames a chunk's undecoded rest needs to be decoded again (0.1 s)
# A shorter rest is the tail of the last word (stamps can be whole seconds): decoded alone, 0.64 s of
# "forced" came out as "se compared to the old" after temperature fallback (beam 5)
MIN_REST_SECONDS = 1.0
MAX_WINDOWS = 4  # per chunk: a decoder that keeps stopping early cannot make a chunk cost more


def _window(chunk: Chunk, seek: int) -> Chunk:
    """The window a chunk is decoded in from ``seek`` (samples): to the chunk's end, at most 30 s."""
    return Chunk(seek, min(chunk.end, seek + 30 * SAMPLE_RATE))


def window_segments(
    tokenizer: Tokenizer, result: DecodingResult, window: Chunk, timestamps: bool
) -> tuple[list[dict], int]:
    """The window's segments (times inside it) and the sample where what was decoded ends: the last
    timestamp pair, or a lone last stamp (the decoder's "no more speech", which the sequential loop
    trusts and the caller checks against the detector), or the window's end when it has no pair."""
    if not timestamps:
        whole = {"seek": window.start // HOP_LENGTH, "start": window.start / SAMPLE_RATE}
        text = {"end": window.end / SAMPLE_RATE, "tokens": result.tokens}
        return [{**whole, **text, "text": tokenizer.decode(result.tokens)}], window.end
    seek, size = window.start // HOP_LENGTH, (window.end - window.start) // HOP_LENGTH
    cut = cut_segments(tokenizer, result, seek, size, 2, TIME_PRECISION)
    start, end = window.start / SAMPLE_RATE, window.end / SAMPLE_RATE
    for s in cut.segments:  # a stamp past the window's audio (into its padding) is clipped to it
        s["start"], s["end"] = min(max(s["start"], start), end), min(max(s["end"], start), end)
    next_seek = cut.seek * HOP_LENGTH
    if cut.single_timestamp_ending and cut.segments:  # "nothing after this stamp": the detector decides
        next_seek = round(cut.segments[-1]["end"] * SAMPLE_RATE)
    return cut.segments, next_seek if window.start < next_seek < window.end else window.end


def _end_bounds(speech: np.ndarray, chunk: Chunk, window: Chunk) -> tuple[int, int]:
    """(floor, ceiling), timestamp indices in ``window`` (a 20 ms frame is one). The floor is the first
    frame from which the chunk's rest is not worth a window of its own: under ``MIN_REST_SPEECH`` speech
    frames or ``MIN_REST_SECONDS`` left (both only shrink as the frame moves on). A window whose text ends
    before it has its rest decoded again; ``hold_end_of_text`` holds end of text before it. The ceiling
    is the chunk's end."""
    frames = speech[window.start // FRAME : chunk.end // FRAME].astype(np.int64)
    after = np.cumsum(frames[::-1])[::-1]  # speech frames from each frame to the chunk's end
    left = len(frames) - np.arange(len(frames))  # frames from each frame to the chunk's end
    done = (after < MIN_REST_SPEECH) | (left < MIN_REST_SECONDS * SAMPLE_RATE // FRAME)
    floor = int(np.argmax(done)) if done.any() else len(frames)
    return floor, (chunk.end - window.start) // FRAME


def _skipping_segment(speech: np.ndarray, pieces: list[dict], window: Chunk) -> tuple[int, int] | None:
    """(start, pause) in samples for the first segment whose words span a long pause (words skipped,
    ``chunking.long_pause``): it is decoded again as two windows, split in the middle of the pause."""
    for piece in pieces:
        start = min(max(round(piece["start"] * SAMPLE_RATE), window.start), window.end)
        end = min(max(round(piece["end"] * SAMPLE_RATE), start), window.end)
        middle = long_pause(speech, start, end)
        if middle is not None and start < middle < window.end:
            return start, middle
    return None


def transcribe_batched(
    model: Whisper,
    audio: str | os.PathLike | np.ndarray | torch.Tensor | AudioSource,
    *,
    batch_size: int = 8,
    beam_size: int | None = None,
    language: str | None = None,
    compression_ratio_threshold: float | None = 2.4,
    logprob_threshold: float | None = -1.0,
    no_speech_threshold: float | None = 0.6,
    vad: str = "energy",
    timestamps: bool = True,
    hold_end: bool = True,
    verbose: bool | None = None,
    **_: Any,
) -> dict:
    """Transcribe with chunks decoded in batches; result shaped like ``transcribe``'s.

    ``batch_size`` 8: as fast as one batch of 16 on the 389 s benchmark file (the encoder and each
    window's own Cross-KV reads dominate, not the weight reads a batch shares) and about 180 MB lighter.
    ``vad``: how chunks are cut (``energy`` or ``silero``). ``timestamps``: segments at the decoder's
    timestamps, each chunk decoded to its end (default), or one segment per chunk decoded once.
    ``hold_end``: no end of text while the detector hears speech after the decoded text (see above);
    False lets the decoder stop there and decodes the rest as a new window.
    ``verbose``, as ``transcribe``'s: True prints each segment once its chunk is decoded and, on a
    terminal, a progress bar in seconds of audio; None or False prints nothing.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if vad not in VADS:
        raise ValueError(f"unknown vad {vad!r}: one of {', '.join(VADS)}")
    # read through a source: a file is read a window at a time (twice: the detector, then the chunks)
    source = open_source(audio, model.dims.n_mels)
    speech = speech_frames(source) if vad == "energy" else silero_frames(source)
    chunks = chunks_from_speech(speech, source.n_samples)
    samples = ForwardSamples(source)  # the chunks' samples, read forward once
    language = _language(model, samples, chunks, language, verbose)
    run = _Run(
        model,
        model.tokenizer.with_options(language=language),
        # without timestamps the chunk boundaries are the only ones, and the decoder skips their rules
        DecodingOptions(language=language, beam_size=beam_size, without_timestamps=not timestamps),
        speech,
        (compression_ratio_threshold, logprob_threshold, no_speech_threshold),
        timestamps,
        hold_end,
    )
    _decode_chunks(run, samples, chunks, batch_size, round(source.n_samples / SAMPLE_RATE, 2), verbose)
    return _result(run, chunks, language, batch_size, vad)


def _language(
    model: Whisper, samples: ForwardSamples, chunks: list[Chunk], language: str | None, verbose: bool | None
) -> str:
    """The language asked for; else, for a multilingual model, the one detected in the first chunk
    (printed unless ``verbose`` is None); else English."""
    if language is None and model.is_multilingual and chunks:
        first = chunk_mel(samples, chunks[0], model.dims.n_mels)
        language, _ = detect_language_from_features(model, model.embed_audio(first[None]))
        if verbose is not None:
            print(f"Detected language: {LANGUAGES[language].title()}")
    return language or "en"


def _decode_chunks(
    run: _Run,
    samples: ForwardSamples,
    chunks: list[Chunk],
    batch_size: int,
    total: float,
    verbose: bool | None,
) -> None:
    """Every chunk and the windows that follow from them, ``batch_size`` at a time, into ``run``; with
    ``verbose`` True, each segment printed once its chunk is done, and a progress bar on a terminal."""
    queue = WindowQueue(chunks)
    show_progress = verbose is True and sys.stderr.isatty()
    bar = tqdm.tqdm(total=total, unit="s", disable=not show_progress, leave=False)
    printer = SegmentPrinter(verbose is True, bar, len(chunks))
    while len(queue):
        group = queue.take_batch(batch_size)
        for pending, pieces, advanced in run.decode_batch(samples, group, queue):
            printer.add(pending.origin, pieces)
            queue.done(pending)
            bar.update(advanced)
        samples.keep_only(queue.ranges(30 * SAMPLE_RATE))  # the rests queued; later chunks are unread
        printer.show_final(queue)
    bar.update(max(0.0, total - bar.n))  # the silence between chunks
    bar.close()


def _result(run: _Run, chunks: list[Chunk], language: str, batch_size: int, vad: str) -> dict:
    """``transcribe``'s result shape: the segments in time order, numbered; and what the batching did."""
    segments = sorted(run.segments, key=lambda s: (s["start"], s["end"]))
    segments = [{"id": i, **s} for i, s in enumerate(segments)]
    return {
        "text": "".join(s["text"] for s in segments),
        "segments": segments,
        "language": language,
        "batched": {
            "chunks": len(chunks),
            "windows": sum(run.batches),
            "batch_size": batch_size,
            "batches": run.batches,
            "fallbacks": run.fallbacks,
            "vad": vad,
        },
    }


class _Run:
    """One recording's batched decode: each batch of windows decoded together, each window's result
    read into segments and follow-up windows (its rest, or a segment that skipped words split in two)."""

    def __init__(
        self,
        model: Whisper,
        tokenizer: Tokenizer,
        options: DecodingOptions,
        speech: np.ndarray,
        thresholds: tuple[float | None, float | None, float | None],
        timestamps: bool,
        hold_end: bool,
    ) -> None:
        self.model, self.tokenizer, self.options, self.speech = model, tokenizer, options, speech
        self.compression_ratio_threshold, self.logprob_threshold, self.no_speech_threshold = thresholds
        self.timestamps, self.hold_end = timestamps, hold_end
        self.store = CacheStore(LocalEncoder(), max_entries=1)
        self.segments: list[dict] = []
        self.fallbacks = 0
        self.batches: list[int] = []

    def decode_batch(self, samples: ForwardSamples, group: list[Pending], queue: WindowQueue):
        """Decode ``group`` as one batch; yield (window, its segments, seconds of audio it settled)."""
        model = self.model
        windows = [_window(p.chunk, p.seek) for p in group]
        self.batches.append(len(group))
        mels = torch.stack([chunk_mel(samples, w, model.dims.n_mels) for w in windows])
        features = model.embed_audio(mels)
        # one Cross-KV row per window; its provenance names the whole batch (every window's Mel, the span)
        batch_provenance = model.encoder_provenance(mels, windows[0].start, windows[-1].end)
        # where each window's rest stops being worth a window; end of text is held before it (``hold_end``)
        bounds = [_end_bounds(self.speech, p.chunk, w) for p, w in zip(group, windows)]
        # the Cross-KV is passed, not kept: as windows finish, the cache replaces it with the rows left
        results = decode_windows(
            model,
            self.tokenizer,
            features,
            self.options,
            model.decoder.project_cross_kv(features, batch_provenance),
            end_bounds=bounds if self.timestamps and self.hold_end else None,
        )
        for k, (pending, window, result) in enumerate(zip(group, windows, results)):
            if self._needs_fallback(result):
                result = self._fall_back(mels[k : k + 1], features[k : k + 1], window)
            pieces, next_seek = self._take(pending, window, result, bounds[k][0], queue)
            yield pending, pieces, round((next_seek - window.start) / SAMPLE_RATE, 2)

    def _needs_fallback(self, result: DecodingResult) -> bool:
        too_repetitive = (
            self.compression_ratio_threshold is not None
            and result.compression_ratio > self.compression_ratio_threshold
        )
        improbable = self.logprob_threshold is not None and result.avg_logprob < self.logprob_threshold
        silent = self.no_speech_threshold is not None and result.no_speech_prob > self.no_speech_threshold
        return (too_repetitive or improbable) and not (silent and improbable)

    def _fall_back(self, mel: torch.Tensor, row: torch.Tensor, window: Chunk) -> DecodingResult:
        """Redo a window alone with temperature fallback, from its own row of the batch's encoder output
        (not encoded a second time)."""
        self.fallbacks += 1
        provenance = self.model.encoder_provenance(mel, window.start, window.end)
        encoded = EncodedWindow(provenance, row, self.model.decoder.project_cross_kv(row, provenance))
        return decode_with_fallback(
            self.model,
            self.tokenizer,
            encoded,
            DEFAULT_TEMPERATURES,
            self.options,
            self.compression_ratio_threshold,
            self.logprob_threshold,
            self.no_speech_threshold,
            self.store,
        )

    def _take(
        self, pending: Pending, window: Chunk, result: DecodingResult, floor: int, queue: WindowQueue
    ) -> tuple[list[dict], int]:
        """The window's segments (kept), its follow-up windows (queued), and where it settled to."""
        chunk, done = pending.chunk, pending.done
        next_seek = window.end
        silent = self.no_speech_threshold is not None and result.no_speech_prob > self.no_speech_threshold
        # a chunk's rest is mostly padding: there "no speech" alone is believed (measured: "Thank you."
        # and "Thanks for watching!" at no-speech 0.80 and 0.83, every real rest at 0.47 or below)
        unsure = self.logprob_threshold is None or result.avg_logprob < self.logprob_threshold or done > 0
        split: tuple[int, int] | None = None  # (sample, sample): decode again from, split at
        kept: list[dict] = []
        if not (silent and unsure):
            pieces, next_seek = window_segments(self.tokenizer, result, window, self.timestamps)
            if self.timestamps and done + 1 < MAX_WINDOWS:
                split = _skipping_segment(self.speech, pieces, window)
            if split is not None:  # that segment and what follows: decoded again, split at the pause
                pieces = [p for p in pieces if round(p["start"] * SAMPLE_RATE) < split[0]]
            for piece in pieces:
                kept.append(
                    {
                        **piece,
                        "start": round(piece["start"], 2),
                        "end": round(piece["end"], 2),
                        "temperature": result.temperature,
                        "avg_logprob": result.avg_logprob,
                        "compression_ratio": result.compression_ratio,
                        "no_speech_prob": result.no_speech_prob,
                    }
                )
        self.segments.extend(kept)
        if split is not None:
            next_seek, middle = split
            queue.push(Chunk(next_seek, middle), next_seek, done + 1, pending.origin)
            queue.push(Chunk(middle, chunk.end), middle, done + 1, pending.origin)
        elif next_seek < window.start + floor * FRAME and done + 1 < MAX_WINDOWS:
            queue.push(chunk, next_seek, done + 1, pending.origin)  # the rest, decoded again from the stamp
        else:
            next_seek = chunk.end
        return kept, next_seek
