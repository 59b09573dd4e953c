"""Batched long-form transcription: cut the audio at silences into ≤ 30 s chunks, decode them together.

Sequential transcription decodes one window at a time, so every decoder step reads all the weights
for one row. Here the chunks of a file are independent (no previous-text prompt), so up to
``batch_size`` of them share each step: the encoder runs on a batch, each layer's Cross-KV holds one row
per chunk, and one decoder call advances every chunk by a token.

Chunks come from a voice-activity detector, ``vad``:
* ``energy`` (default): 20 ms frames whose RMS is above an adaptive floor are speech; chunks grow over
  speech and silences and are cut at the latest pause before 30 s, so they come close to 30 s and few
  windows need encoding (389 s of speech: 14 windows, against 20 when cutting at the longest pause);
* ``silero``: silero-vad's speech regions (what faster-whisper's batched pipeline uses), merged in order
  into chunks of at most 30 s.
Windows finish decoding at different steps; finished ones leave the batch. A chunk whose greedy result
is repetitive or improbable is redone alone with temperature fallback, as the sequential mode would.
With ``timestamps=True`` segments carry the timestamps the decoder predicts inside each chunk
(sentence-sized subtitle cues); the default is one segment per chunk, because the benchmark measured
timestamped chunks losing words (long file: WER 13.4 % against 7.3 % sequential, commit ca20323): a
chunk is decoded once, and speech after the decoder's last timestamp is not decoded again as the
sequential loop's seek would (the likely cause, not yet confirmed).
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import tqdm

from whisperkv.audio import (
    HOP_LENGTH,
    N_FFT,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    log_mel_spectrogram,
)
from whisperkv.audio_source import AudioSource, open_source
from whisperkv.cache.store import CacheStore
from whisperkv.decoding.decode import decode_windows
from whisperkv.decoding.language import detect_language_from_features
from whisperkv.decoding.options import DecodingOptions
from whisperkv.transcribe import DEFAULT_TEMPERATURES, decode_with_fallback

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer

FRAME = SAMPLE_RATE // 50  # 20 ms
VAD_READ = 3000 * FRAME  # samples a source is read in for the detector: 60 s, a whole number of frames
TIME_PRECISION = 0.02  # seconds per timestamp token
VADS = ("energy", "silero")


@dataclass(frozen=True)
class Chunk:
    start: int  # first sample
    end: int  # one past the last sample


def frame_rms(audio: np.ndarray | AudioSource) -> np.ndarray:
    """RMS of every whole 20 ms frame. A source is read a minute at a time, so only the RMS values
    (1/320 of the samples) are held, whatever the recording's length."""
    if isinstance(audio, np.ndarray):
        n = len(audio) // FRAME
        frames = audio[: n * FRAME].reshape(n, FRAME)
        return np.sqrt((frames.astype(np.float64) ** 2).mean(axis=1) + 1e-12)
    parts, start = [], 0
    while True:  # to the end, which a file source learns by reaching it (no length needed beforehand)
        block = audio.samples(start, start + VAD_READ).numpy()
        parts.append(frame_rms(block))
        if len(block) < VAD_READ:
            return np.concatenate(parts)
        start += VAD_READ


def speech_frames(audio: np.ndarray | AudioSource, floor_db: float = -45.0) -> np.ndarray:
    """Boolean per 20 ms frame: louder than an absolute floor and than the noise level.

    The noise level is 3× the quietest tenth of the frames, but never above a quarter of the loud
    frames' level, so a recording with almost no pauses still has its few pauses found.
    """
    rms = frame_rms(audio)
    if len(rms) == 0:
        return np.zeros(0, dtype=bool)
    quiet, loud = np.percentile(rms, [10, 95])
    threshold = max(10 ** (floor_db / 20), min(3.0 * quiet, 0.25 * loud))
    return rms > threshold


def split_at_silences(
    audio: np.ndarray | AudioSource, max_seconds: float = 30.0, min_pause: float = 0.2
) -> list[Chunk]:
    """≤ max_seconds chunks covering all speech, each cut in the latest pause of at least ``min_pause``."""
    speech = speech_frames(audio)
    n_samples = len(audio) if isinstance(audio, np.ndarray) else audio.n_samples
    max_frames = int(max_seconds * 50)
    chunks: list[Chunk] = []
    i, n = 0, len(speech)
    while i < n:
        while i < n and not speech[i]:
            i += 1  # skip leading silence
        if i >= n:
            break
        limit = min(i + max_frames, n)
        if limit == n:
            end = n
        else:
            # the latest pause of at least min_pause before the limit, so chunks come close to 30 s and
            # few windows are encoded; failing that, the longest pause after the first third
            latest, longest, longest_len = None, None, 0
            run_start = None
            for j in range(i + max_frames // 3, limit):
                if not speech[j]:
                    run_start = j if run_start is None else run_start
                    run_len = j - run_start + 1
                    if run_len >= int(min_pause * 50):
                        latest = run_start + run_len // 2
                    if run_len > longest_len:
                        longest, longest_len = run_start + run_len // 2, run_len
                else:
                    run_start = None
            end = latest if latest is not None else (longest if longest_len > 0 else limit)
        last_speech = end
        while last_speech > i and not speech[last_speech - 1]:
            last_speech -= 1
        chunks.append(Chunk(i * FRAME, min(n_samples, (last_speech + 2) * FRAME)))
        i = end
    return chunks


def split_with_silero(audio: np.ndarray | AudioSource, max_seconds: float = 30.0) -> list[Chunk]:
    """silero-vad's speech regions, merged in order into chunks of at most ``max_seconds``.

    A region longer than that (silero cuts at ``max_speech_duration_s``) becomes a chunk of its own.
    silero judges 32 ms frames with tiny tensors: it runs on one thread (two threads only add barrier
    waits per frame), on the ONNX model when onnxruntime is installed. Importing silero_vad sets torch's
    thread count to 1 for the process; the caller's count is put back either way.
    """
    if not isinstance(audio, np.ndarray):  # silero-vad reads the whole waveform at once
        audio = audio.samples(0, audio.n_samples).numpy()
    threads = torch.get_num_threads()
    try:
        try:
            import silero_vad
        except ImportError as exc:
            raise ImportError(
                "vad='silero' needs the silero-vad package: pip install 'whisperkv[stream]'"
            ) from exc
        torch.set_num_threads(1)
        with warnings.catch_warnings():  # silero-vad locates its model with a deprecated importlib call
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                model = silero_vad.load_silero_vad(onnx=True)
            except ImportError:  # no onnxruntime: the TorchScript model ships with the package too
                model = silero_vad.load_silero_vad()
        regions = silero_vad.get_speech_timestamps(
            torch.from_numpy(audio), model, sampling_rate=SAMPLE_RATE, max_speech_duration_s=max_seconds - 1
        )
    finally:
        torch.set_num_threads(threads)
    limit = int(max_seconds * SAMPLE_RATE)
    chunks: list[Chunk] = []
    start = end = None
    for region in regions:
        if start is not None and region["end"] - start > limit:
            chunks.append(Chunk(start, end))
            start = None
        if start is None:
            start = region["start"]
        end = region["end"]
    if start is not None:
        chunks.append(Chunk(start, end))
    return chunks


def timestamped_segments(tokens: list[int], tokenizer: Tokenizer, start: float, end: float) -> list[tuple]:
    """(start s, end s, text tokens) of each segment a chunk's timestamped tokens mark out.

    Like the sequential loop's splitting of a window: a pair of consecutive timestamp tokens closes one
    segment and opens the next. A chunk is decoded once (no seek into it), so text after the last
    timestamp becomes a last segment that ends where the chunk ends.
    """
    ts = tokenizer.timestamp_begin
    segments: list[tuple] = []
    opened: float | None = None
    text: list[int] = []
    for t in tokens:
        if t >= ts:
            at = min(end, start + (t - ts) * TIME_PRECISION)
            if opened is None:
                opened = at
            elif text:
                segments.append((opened, at, text))
                opened, text = None, []
            else:
                opened = at  # two stamps with no text between: the later one opens
        elif t < tokenizer.eot:
            if opened is None:
                opened = segments[-1][1] if segments else start
            text.append(t)
    if text:
        segments.append((opened if opened is not None else start, end, text))
    return segments


def chunk_mel(audio: np.ndarray | AudioSource, chunk: Chunk, n_mels: int) -> torch.Tensor:
    """The chunk's 30 s log-Mel window [n_mels, 3000], padded with silence as ``transcribe`` pads.

    Only as much silence as the window's last frame reaches is transformed (30 s of padding per chunk
    would double the STFT work); the frames, and the maximum the dynamic range is cut from, are the same.
    """
    if isinstance(audio, np.ndarray):
        samples = audio[chunk.start : chunk.end]
    else:
        samples = audio.samples(chunk.start, chunk.end)
    padding = max(0, N_SAMPLES + N_FFT - len(samples))
    return log_mel_spectrogram(samples, n_mels, padding=padding)[:, :N_FRAMES]


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
    timestamps: bool = False,
    verbose: bool | None = None,
    **_: Any,
) -> dict:
    """Transcribe with chunks decoded in batches; result shaped like ``transcribe``'s.

    ``batch_size`` 8 (14 chunks run as 7 + 7): as fast as one batch of 16 on the 389 s benchmark file
    (the encoder and each window's own Cross-KV reads dominate, not the weight reads a batch shares) and
    about 180 MB lighter. ``vad``: how chunks are cut (``energy`` or ``silero``). ``timestamps``: segments
    from the decoder's timestamps, or one per chunk (default; see the module docstring).
    ``verbose=True`` on a terminal shows a progress bar in seconds of audio, like ``transcribe``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    if vad not in VADS:
        raise ValueError(f"unknown vad {vad!r}: one of {', '.join(VADS)}")
    # read through a source: a file is read a window at a time (twice: the detector, then the chunks)
    audio = open_source(audio, model.dims.n_mels)
    chunks = split_at_silences(audio) if vad == "energy" else split_with_silero(audio)
    if language is None and model.is_multilingual and chunks:
        first = chunk_mel(audio, chunks[0], model.dims.n_mels)
        language, _ = detect_language_from_features(model, model.embed_audio(first[None]))
    language = language or "en"
    tokenizer = model.tokenizer.with_options(language=language)
    # without timestamps the chunk boundaries are the only ones, and the decoder skips their rules
    options = DecodingOptions(language=language, beam_size=beam_size, without_timestamps=not timestamps)
    store = CacheStore(max_entries=1)
    segments: list[dict] = []
    fallbacks = 0
    # equal batches (14 chunks at batch_size 8: 7 + 7, not 8 + 6): a batch takes as many steps as its
    # longest window, so a small last batch would pay nearly a full batch's steps for few windows
    n_batches = max(1, math.ceil(len(chunks) / batch_size))
    size = max(1, math.ceil(len(chunks) / n_batches))
    batches: list[int] = []
    show_progress = verbose is True and sys.stderr.isatty()
    bar = tqdm.tqdm(
        total=round(audio.n_samples / SAMPLE_RATE, 2), unit="s", disable=not show_progress, leave=False
    )
    for first in range(0, len(chunks), size):
        group = chunks[first : first + size]
        batches.append(len(group))
        mels = torch.stack([chunk_mel(audio, c, model.dims.n_mels) for c in group])
        features = model.embed_audio(mels)
        # one Cross-KV row per chunk; its provenance names the whole batch (every window's Mel, the span)
        batch_provenance = model.encoder_provenance(mels, group[0].start, group[-1].end)
        # passed, not kept: as windows finish, the cache replaces these with copies of the rows left
        results = decode_windows(
            model, tokenizer, features, options, model.decoder.project_cross_kv(features, batch_provenance)
        )
        for k, (chunk, result) in enumerate(zip(group, results)):
            too_repetitive = (
                compression_ratio_threshold is not None
                and result.compression_ratio > compression_ratio_threshold
            )
            improbable = logprob_threshold is not None and result.avg_logprob < logprob_threshold
            silent = no_speech_threshold is not None and result.no_speech_prob > no_speech_threshold
            if (too_repetitive or improbable) and not (silent and improbable):
                fallbacks += 1
                window = store.encode(model, mels[k], chunk.start, chunk.end, "batched fallback")
                result = decode_with_fallback(
                    model,
                    tokenizer,
                    window,
                    DEFAULT_TEMPERATURES,
                    options,
                    compression_ratio_threshold,
                    logprob_threshold,
                    no_speech_threshold,
                    store,
                )
            if silent and (logprob_threshold is None or result.avg_logprob < logprob_threshold):
                continue  # silence
            chunk_start, chunk_end = chunk.start / SAMPLE_RATE, chunk.end / SAMPLE_RATE
            pieces = (
                timestamped_segments(result.tokens, tokenizer, chunk_start, chunk_end)
                if timestamps
                else [(chunk_start, chunk_end, result.tokens)]
            )
            for start, end, ids in pieces:
                segments.append(
                    {
                        "id": len(segments),
                        "seek": chunk.start // HOP_LENGTH,
                        "start": round(start, 2),
                        "end": round(end, 2),
                        "text": tokenizer.decode(ids),
                        "tokens": ids,
                        "temperature": result.temperature,
                        "avg_logprob": result.avg_logprob,
                        "compression_ratio": result.compression_ratio,
                        "no_speech_prob": result.no_speech_prob,
                    }
                )
        bar.update(round((group[-1].end - group[0].start) / SAMPLE_RATE, 2))
    bar.close()
    return {
        "text": "".join(s["text"] for s in segments),
        "segments": segments,
        "language": language,
        "batched": {
            "chunks": len(chunks),
            "batch_size": batch_size,
            "batches": batches,
            "fallbacks": fallbacks,
            "vad": vad,
        },
    }
