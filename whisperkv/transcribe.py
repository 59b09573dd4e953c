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

The loop itself lives in ``whisperkv.engine.job`` (a job a scheduler drives, alone here or batched
with other requests in a server); ``transcribe`` runs one job to the end in the calling thread.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from whisperkv.audio_source import AudioSource
from whisperkv.cache.store import CacheStore, EncodedWindow
from whisperkv.decoding.decode import decode_window
from whisperkv.decoding.options import DecodingOptions, DecodingResult
from whisperkv.engine.job import SILENCE_PEAK, Job
from whisperkv.engine.options import DEFAULT_TEMPERATURES, TranscribeOptions
from whisperkv.engine.scheduler import Scheduler
from whisperkv.engine.segments import PUNCTUATION

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer

__all__ = ["DEFAULT_TEMPERATURES", "PUNCTUATION", "SILENCE_PEAK", "decode_with_fallback", "transcribe"]


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
    **decode_options: Any,
) -> dict:
    """Transcribe a file or a 16 kHz float32 waveform. Options and result as in openai-whisper.

    ``decode_options`` are ``DecodingOptions`` fields (``language``, ``task``, ``beam_size``, ``best_of``,
    ``hotwords``, ...). The audio becomes one job of the engine, driven to the end in this thread by a
    scheduler of its own: the same code a server runs with many jobs in one batch.
    """
    options = TranscribeOptions.from_dict(
        {
            "verbose": verbose,
            "temperature": temperature,
            "compression_ratio_threshold": compression_ratio_threshold,
            "logprob_threshold": logprob_threshold,
            "no_speech_threshold": no_speech_threshold,
            "condition_on_previous_text": condition_on_previous_text,
            "initial_prompt": initial_prompt,
            "carry_initial_prompt": carry_initial_prompt,
            "word_timestamps": word_timestamps,
            "prepend_punctuations": prepend_punctuations,
            "append_punctuations": append_punctuations,
            "clip_timestamps": clip_timestamps,
            "hallucination_silence_threshold": hallucination_silence_threshold,
            **decode_options,
        }
    )
    scheduler = Scheduler(model)
    job = Job(model, audio, options, request_id=uuid.uuid4().hex)
    return scheduler.run(scheduler.submit_job(job))
