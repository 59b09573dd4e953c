"""``WhisperModel``: faster-whisper's model object, driving whisperkv's engine.

``transcribe`` does what faster-whisper does before it returns: decodes the audio, runs the
voice-activity filter, detects the language — so ``TranscriptionInfo`` is complete at once — and returns
the segments as a generator: each 30 s window is decoded only when the caller reads past the segments
already made (one scheduler tick at a time: whisperkv's job, as ``whisperkv.transcribe`` runs it).
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np
import torch

from whisperkv.audio import SAMPLE_RATE
from whisperkv.engine.options import TranscribeOptions
from whisperkv.engine.scheduler import Scheduler
from whisperkv.faster import language as detection
from whisperkv.faster import vad
from whisperkv.faster.audio import decode_audio
from whisperkv.faster.job import FasterJob
from whisperkv.faster.options import TEMPERATURES, build_options, check_unsupported, engine_options
from whisperkv.faster.types import Segment, TranscriptionInfo, TranscriptionOptions, VadOptions, Word
from whisperkv.tokenizer import LANGUAGES

PUNCTUATION_BEFORE = "\"'“¿([{-"
PUNCTUATION_AFTER = "\"'.。,，!！?？:：”)]}、"
#: faster-whisper's compute types → whisperkv's (its int8 keeps float32 activations: CTranslate2's
#: ``int8_float32``); others (int8_float16, int16, ...) are refused by name
COMPUTE_TYPES = {
    "default": "default",
    "auto": "default",
    "float32": "float32",
    "int8": "int8",
    "int8_float32": "int8",
    "float16": "float16",
    "bfloat16": "bfloat16",
}


def waveform(audio: str | os.PathLike | BinaryIO | np.ndarray) -> np.ndarray:
    """A path, a file-like object or a 16 kHz float32 waveform, as a 1-D float32 waveform."""
    if isinstance(audio, torch.Tensor):
        audio = audio.detach().cpu().numpy()
    if not isinstance(audio, np.ndarray):
        return decode_audio(audio, SAMPLE_RATE)
    if audio.ndim != 1 or not np.issubdtype(audio.dtype, np.floating):
        raise ValueError(
            f"audio must be a 1-D float waveform at 16 kHz, got {audio.dtype} of shape {audio.shape}"
        )
    if not np.isfinite(audio).all():
        raise ValueError("audio holds NaN or infinite samples")
    return audio.astype(np.float32, copy=False)


def segment_record(index: int, segment: dict, with_words: bool) -> Segment:
    words = None
    if with_words:
        words = [Word(w["start"], w["end"], w["word"], w["probability"]) for w in segment.get("words") or []]
    return Segment(
        id=index,
        seek=segment["seek"],
        start=segment["start"],
        end=segment["end"],
        text=segment["text"],
        tokens=list(segment["tokens"]),
        avg_logprob=segment["avg_logprob"],
        compression_ratio=segment["compression_ratio"],
        no_speech_prob=segment["no_speech_prob"],
        words=words,
        temperature=segment["temperature"],
    )


class WhisperModel:
    """faster-whisper's ``WhisperModel(model_size_or_path, device, compute_type, cpu_threads)``.

    ``model_size_or_path``: a name whisperkv has offline (``whisperkv.available_models()``: tiny.en,
    base) or a path (CTranslate2 directory — faster-whisper's own models load as they are —, transformers
    directory, OpenAI ``.pt``). whisperkv never downloads: ``download_root`` and ``local_files_only``
    are accepted and change nothing; ``files``, ``revision`` and ``use_auth_token`` are refused.
    ``cpu_threads`` > 0 sets PyTorch's intra-op threads for the process (CTranslate2 sets them per
    model; PyTorch has one pool). ``num_workers``: whisperkv serves concurrent calls through its
    scheduler (``whisperkv serve``), not here: only 1.
    """

    def __init__(
        self,
        model_size_or_path: str,
        device: str = "auto",
        device_index: int | list[int] = 0,
        compute_type: str = "default",
        cpu_threads: int = 0,
        num_workers: int = 1,
        download_root: str | None = None,
        local_files_only: bool = False,
        files: dict | None = None,
        revision: str | None = None,
        use_auth_token: str | bool | None = None,
        **model_kwargs: Any,
    ) -> None:
        from whisperkv.load import load_model

        if compute_type not in COMPUTE_TYPES:
            raise ValueError(f"unknown compute_type {compute_type!r}: one of {', '.join(COMPUTE_TYPES)}")
        for name, value in (("files", files), ("revision", revision), ("use_auth_token", use_auth_token)):
            if value is not None:
                raise ValueError(f"{name} is not supported by whisperkv: it loads local models only")
        if model_kwargs:
            raise ValueError(f"unknown WhisperModel option(s) {', '.join(map(repr, sorted(model_kwargs)))}")
        if num_workers != 1:
            raise ValueError(f"num_workers={num_workers!r} is not supported by whisperkv; use 1")
        if not isinstance(cpu_threads, int) or cpu_threads < 0:
            raise ValueError(f"cpu_threads must be an integer >= 0, got {cpu_threads!r}")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device not in ("cpu", "cuda"):
            raise ValueError(f"unknown device {device!r}: cpu, cuda or auto")
        if device == "cuda" and isinstance(device_index, int) and device_index:
            device = f"cuda:{device_index}"
        if cpu_threads > 0:
            torch.set_num_threads(cpu_threads)
        self.model = load_model(model_size_or_path, device=device, compute_type=COMPUTE_TYPES[compute_type])
        self.compute_type = compute_type

    @property
    def supported_languages(self) -> list[str]:
        return list(LANGUAGES) if self.model.is_multilingual else ["en"]

    def detect_language(
        self,
        audio: np.ndarray | None = None,
        features: np.ndarray | None = None,
        vad_filter: bool = False,
        vad_parameters: dict | VadOptions | None = None,
        language_detection_segments: int = 1,
        language_detection_threshold: float = 0.5,
    ) -> tuple[str, float, list[tuple[str, float]] | None]:
        """(language, probability, every language ranked) of the first windows of a 16 kHz waveform."""
        if audio is None:
            raise ValueError("detect_language needs audio (whisperkv computes its own log-Mel features)")
        audio = waveform(audio)
        if vad_filter:
            audio = vad.join_chunks(audio, vad.speech_chunks(audio, vad.vad_options(vad_parameters)))
        return detection.detect(self.model, audio, language_detection_segments, language_detection_threshold)

    def transcribe(
        self,
        audio: str | os.PathLike | BinaryIO | np.ndarray,
        language: str | None = None,
        task: str = "transcribe",
        log_progress: bool = False,
        beam_size: int = 5,
        best_of: int = 5,
        patience: float = 1,
        length_penalty: float = 1,
        repetition_penalty: float = 1,
        no_repeat_ngram_size: int = 0,
        temperature: float | Sequence[float] = TEMPERATURES,
        compression_ratio_threshold: float | None = 2.4,
        log_prob_threshold: float | None = -1.0,
        no_speech_threshold: float | None = 0.6,
        condition_on_previous_text: bool = True,
        prompt_reset_on_temperature: float = 0.5,
        initial_prompt: str | Iterable[int] | None = None,
        prefix: str | None = None,
        suppress_blank: bool = True,
        suppress_tokens: list[int] | None = (-1,),
        without_timestamps: bool = False,
        max_initial_timestamp: float = 1.0,
        word_timestamps: bool = False,
        prepend_punctuations: str = PUNCTUATION_BEFORE,
        append_punctuations: str = PUNCTUATION_AFTER,
        multilingual: bool = False,
        vad_filter: bool = False,
        vad_parameters: dict | VadOptions | None = None,
        max_new_tokens: int | None = None,
        chunk_length: int | None = None,
        clip_timestamps: str | list[float] = "0",
        hallucination_silence_threshold: float | None = None,
        hotwords: str | None = None,
        language_detection_threshold: float | None = 0.5,
        language_detection_segments: int = 1,
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """(segments, info) as faster-whisper returns them; the segments are decoded as they are read."""
        values = dict(locals())
        del values["self"]
        check_unsupported(
            repetition_penalty,
            no_repeat_ngram_size,
            prompt_reset_on_temperature,
            chunk_length,
            length_penalty,
        )
        options = build_options({**values, "suppress_tokens": _listed(suppress_tokens)})
        if multilingual and not self.model.is_multilingual:
            warnings.warn("multilingual=True on an English-only model: set to False", stacklevel=2)
            options.multilingual = False
        samples = waveform(audio)
        duration = len(samples) / SAMPLE_RATE
        vad_options, chunks = None, None
        if vad_filter and clip_timestamps == "0":
            vad_options = vad.vad_options(vad_parameters)
            chunks = vad.speech_chunks(samples, vad_options)
            samples = vad.join_chunks(samples, chunks)
        if len(samples) == 0:  # nothing heard: no window to decode, none to detect a language on
            detected = detection.ENGLISH_ONLY if not self.model.is_multilingual else ("en", 0.0, None)
            found = (self._given_language(language), 1.0, None) if language else detected
            return iter(()), self._info(found, duration, 0.0, options, vad_options)
        job, found = self._start_job(samples, options, self._given_language(language), values)
        segments: Iterator[Segment] = self._segments(job, options.word_timestamps)
        if chunks:
            segments = vad.restore_times(segments, chunks)
        return segments, self._info(found, duration, len(samples) / SAMPLE_RATE, options, vad_options)

    def _start_job(
        self, samples: np.ndarray, options: TranscriptionOptions, language: str | None, values: dict
    ) -> tuple[FasterJob, tuple[str, float, list[tuple[str, float]] | None]]:
        """The started job (its language known), and (language, probability, all ranked) for the info."""
        clip_start = _clip_start(options.clip_timestamps)
        segments = values["language_detection_segments"]
        found = None
        if language is None and self.model.is_multilingual and (segments != 1 or clip_start > 0):
            audio = samples[round(clip_start * SAMPLE_RATE) :]
            found = detection.detect(self.model, audio, segments, values["language_detection_threshold"])
            language = found[0]
        job = self._job(samples, options, language, values["task"])
        job.start()  # (language None: detected on the first window, as whisperkv.transcribe does)
        if found is None and language is None:
            probs = detection.ranked(job.language_probs) if job.language_probs else None
            found = (job.language, dict(probs)[job.language] if probs else 1.0, probs)
        return job, found or (job.language, 1.0, None)

    @staticmethod
    def _info(
        found: tuple, duration: float, after_vad: float, options: TranscriptionOptions, vad_options: Any
    ) -> TranscriptionInfo:
        return TranscriptionInfo(
            language=found[0],
            language_probability=found[1],
            duration=duration,
            duration_after_vad=after_vad,
            all_language_probs=found[2],
            transcription_options=options,
            vad_options=vad_options,
        )

    def _given_language(self, language: str | None) -> str | None:
        if language is not None and not self.model.is_multilingual and language != "en":
            warnings.warn(f"language {language!r} on an English-only model: 'en' is used", stacklevel=3)
            return "en"
        return language

    def _job(self, samples: np.ndarray, options: Any, language: str | None, task: str) -> FasterJob:
        prompt_ids = options.initial_prompt if isinstance(options.initial_prompt, list) else None
        return FasterJob(
            self.model,
            samples,
            TranscribeOptions.from_dict(engine_options(options, language, task)),
            request_id=uuid.uuid4().hex,
            multilingual=options.multilingual,
            prompt_ids=prompt_ids,
        )

    def _segments(self, job: FasterJob, with_words: bool) -> Iterator[Segment]:
        """The job's segments as its windows finish; empty ones left out, ids from 1 (faster-whisper's)."""
        scheduler = Scheduler(self.model)
        handle = scheduler.submit_job(job)
        sent, index = 0, 0
        try:
            while True:
                done = handle.done
                while sent < len(job.all_segments):
                    segment = job.all_segments[sent]
                    sent += 1
                    if segment["start"] == segment["end"] or not segment["text"].strip():
                        continue
                    index += 1
                    yield segment_record(index, segment, with_words)
                if done:
                    handle.result()  # the job's error, if it failed
                    return
                if not scheduler.tick():
                    raise RuntimeError("the transcription job stopped before it finished")
        finally:
            job.close()


def _listed(tokens: Iterable[int] | None) -> list[int] | None:
    return None if tokens is None else [int(t) for t in tokens]


def _clip_start(clip_timestamps: str | list[float]) -> float:
    if isinstance(clip_timestamps, str):
        first = clip_timestamps.split(",")[0].strip()
        return float(first) if first else 0.0
    return float(clip_timestamps[0]) if len(clip_timestamps) else 0.0
