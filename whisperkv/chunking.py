"""Where the batched mode cuts a recording: voice-activity detection and ≤ 30 s chunks cut at pauses.

Two detectors, ``energy`` (20 ms frames louder than an adaptive floor) and ``silero`` (silero-vad's
speech regions, what faster-whisper's batched pipeline uses). Both give a speech mask of 20 ms frames;
chunks are cut from that mask the same way, so the two differ only in what they call speech.

A cut goes in a pause, and which pause matters: a cut inside a sentence (a 0.2 s breath between two
words) leaves each side a fragment the decoder mangles or drops (measured: "she had your dark suit in
greasy wash water all year" came out as "ducks who in Greece" + "for"). So the cut takes the longest
pause in the chunk's second half (pauses of 0.5 s or more count as equal, the latest of those wins, so
chunks still come close to 30 s), and every chunk keeps up to 0.3 s of the silence around its speech:
an onset trimmed to the first loud frame loses a quiet first word ("the" of "the frosty air"), and a
last word clipped at its end makes the decoder drop the sentence.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from whisperkv.audio import N_FFT, N_FRAMES, N_SAMPLES, SAMPLE_RATE, log_mel_spectrogram
from whisperkv.audio_source import AudioSource

FRAME = SAMPLE_RATE // 50  # 20 ms
VAD_READ = 3000 * FRAME  # samples a source is read in for the detector: 60 s, a whole number of frames
PAD_FRAMES = 15  # silence kept either side of a chunk's speech: 0.3 s
GOOD_PAUSE_FRAMES = 25  # pauses of 0.5 s or more are equally good places to cut
LONG_PAUSE_FRAMES = 100  # a decoded segment across a pause this long (2 s) skipped words (``long_pause``)
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


def silero_frames(audio: np.ndarray | AudioSource, max_seconds: float = 30.0) -> np.ndarray:
    """Boolean per 20 ms frame: inside one of silero-vad's speech regions.

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
    speech = np.zeros(len(audio) // FRAME, dtype=bool)
    for region in regions:
        speech[region["start"] // FRAME : -(-region["end"] // FRAME)] = True
    return speech


def _cut(speech: np.ndarray, limit: int, earliest: int) -> int:
    """The frame to cut at: the middle of the best pause in [earliest, limit), or ``limit`` if none."""
    best, best_key = limit, (-1, -1)
    run_start = None
    for j in range(earliest, limit + 1):
        if j < limit and not speech[j]:
            run_start = j if run_start is None else run_start
            continue
        if run_start is not None:
            length = j - run_start
            key = (min(length, GOOD_PAUSE_FRAMES), run_start)  # the longest (to 0.5 s), then the latest
            if key > best_key:
                best, best_key = run_start + length // 2, key
            run_start = None
    return best


def chunks_from_speech(speech: np.ndarray, n_samples: int, max_seconds: float = 30.0) -> list[Chunk]:
    """≤ ``max_seconds`` chunks covering every speech frame, cut in pauses, padded with their silence."""
    max_frames = int(max_seconds * 50)
    chunks: list[Chunk] = []
    n = len(speech)
    i, floor = 0, 0  # floor: where the previous chunk ended (frames)
    while i < n:
        while i < n and not speech[i]:
            i += 1  # skip leading silence
        if i >= n:
            break
        start = max(floor, i - PAD_FRAMES)
        limit = min(start + max_frames, n)
        end = n if limit == n else _cut(speech, limit, i + (limit - i) // 2)
        last = end
        while last > i and not speech[last - 1]:
            last -= 1
        stop = min(end if end < n else n, last + PAD_FRAMES, start + max_frames)
        chunks.append(Chunk(start * FRAME, min(n_samples, stop * FRAME)))
        i = floor = max(end, stop)
    return chunks


def long_pause(speech: np.ndarray, start: int, end: int) -> int | None:
    """The middle (a sample) of the longest pause of ``LONG_PAUSE_FRAMES`` or more between the first
    and last speech frames of [start, end) (samples), or None.

    Whisper ends a segment at a pause that long; a segment whose words span one has lost some: beam
    search kept only the easier sentence after the pause (measured: every candidate of a 15 s chunk
    read "<|0.00|> For although ...<|15.28|>" and skipped the sentence before a 2.8 s pause; segments
    with all their words span at most 1.7 s of pause, stamps being whole seconds).
    """
    frames = speech[start // FRAME : end // FRAME]
    loud = np.flatnonzero(frames)
    if len(loud) < 2:
        return None
    gaps = np.diff(loud) - 1  # silent frames between consecutive speech frames
    k = int(np.argmax(gaps))
    if gaps[k] < LONG_PAUSE_FRAMES:
        return None
    return start // FRAME * FRAME + (int(loud[k]) + 1 + int(gaps[k]) // 2) * FRAME


def split_at_silences(audio: np.ndarray | AudioSource, max_seconds: float = 30.0) -> list[Chunk]:
    """The energy detector's chunks (see the module docstring)."""
    speech = speech_frames(audio)  # first: a file source learns its length by reading to the end
    n_samples = len(audio) if isinstance(audio, np.ndarray) else audio.n_samples
    return chunks_from_speech(speech, n_samples, max_seconds)


def split_with_silero(audio: np.ndarray | AudioSource, max_seconds: float = 30.0) -> list[Chunk]:
    """silero-vad's chunks (see the module docstring)."""
    n_samples = len(audio) if isinstance(audio, np.ndarray) else audio.n_samples
    return chunks_from_speech(silero_frames(audio, max_seconds), n_samples, max_seconds)


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
