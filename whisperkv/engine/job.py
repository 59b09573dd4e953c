"""One transcription request as a resumable state machine: the long-form loop, one window at a time.

Whoever owns the model (the scheduler) drives it:

    job.start()                   language (multilingual models), tokenizer, the first prompt
    task = job.next_window()      the next 30 s window to decode: exact log-Mel, prompt, temperature;
                                  digital silence and finished clips are skipped here; None when done
    ... the scheduler encodes task's window and decodes it (batched with other jobs' windows) ...
    retry = job.window_done(task, result)
                                  too repetitive / improbable → the same window at the next temperature
                                  (its encoder output and Cross-KV reused); otherwise: silence skip,
                                  segments, seek advance, word alignment, hallucination check
    job.result()                  the dict ``transcribe()`` returns

The steps, their order and their arithmetic are openai-whisper's ``transcribe`` loop; only the driver
changed, so one job decoded alone or beside 31 others gives the same result.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import tqdm

from whisperkv.audio import FRAMES_PER_SECOND, HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE, pad_or_trim
from whisperkv.audio_source import AudioSource, open_source
from whisperkv.cache.store import CacheStore, EncodedWindow
from whisperkv.decoding.language import detect_language_from_features
from whisperkv.decoding.options import DecodingOptions, DecodingResult
from whisperkv.decoding.window import WindowDecode
from whisperkv.engine.options import TranscribeOptions, fallback_options
from whisperkv.engine.segments import cut_segments, drop_hallucinations
from whisperkv.local_encoder import LocalEncoder
from whisperkv.tokenizer import LANGUAGES

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer

#: Peak amplitude below which a window is digital silence (-80 dBFS): it is skipped without decoding,
#: because Whisper hallucinates short phrases ("You") on pure silence.
SILENCE_PEAK = 1e-4


@dataclass
class WindowTask:
    """One window of one job to decode at one temperature of the fallback schedule."""

    seek: int  # first Mel frame of the window
    segment_size: int  # Mel frames of real audio in it
    mel: torch.Tensor  # [n_mels, 3000], padded with the source's silence frames
    options: DecodingOptions  # prompt and temperature of this attempt
    attempt: int  # index into the temperature schedule
    window: EncodedWindow | None = None  # set by the encoder step; reused by retries

    @property
    def window_start(self) -> int:
        return self.seek * HOP_LENGTH

    @property
    def window_end(self) -> int:
        return (self.seek + self.segment_size) * HOP_LENGTH


class Job:
    """The state of one request's long-form loop: seek, prompts, segments, its own caches and RNG."""

    def __init__(
        self,
        model: Whisper,
        audio: Any,
        options: TranscribeOptions,
        request_id: str,
        generator: torch.Generator | None = None,
    ) -> None:
        self.model = model
        self.request_id = request_id
        self.options = options
        self.source: AudioSource = open_source(audio, model.dims.n_mels)
        # sampling draws from the job's own generator, seeded from the global RNG as the job is made:
        # alone it draws what openai-whisper draws after the same torch.manual_seed; batched, the
        # other jobs' draws cannot shift it
        if generator is None:
            generator = torch.Generator()
            generator.set_state(torch.random.get_rng_state())
        self.generator = generator
        # the window being decoded (the language window is the first one when they are the same window;
        # otherwise it is not needed again); provenance names this request. The seek only moves forward,
        # and a window's task holds it while it is decoded, retried and aligned: one entry, so a finished
        # window's Cross-KV is freed before the next window is encoded, not after
        self.store = CacheStore(options.encoder or LocalEncoder(), max_entries=1, request_id=request_id)
        self.content_frames = self.source.content_frames
        self.content_duration = float(self.content_frames * HOP_LENGTH / SAMPLE_RATE)
        self.input_stride = N_FRAMES // model.dims.n_audio_ctx  # Mel frames per encoder position: 2
        self.time_precision = self.input_stride * HOP_LENGTH / SAMPLE_RATE  # seconds per timestamp: 0.02
        self.started = False
        self.finished = False
        self.all_segments: list[dict] = []
        self.all_tokens: list[int] = []
        self.last_cache_report: dict | None = None
        self.language_probs: dict[str, float] | None = None
        self.bar: tqdm.tqdm | None = None

    @property
    def expected_rows(self) -> int:
        """Decoder rows the first attempt of a window takes: beams, best-of samples, or one."""
        decode = self.options.decode_options
        if self.options.temperatures[0] > 0:
            return decode.get("best_of") or 1
        return decode.get("beam_size") or 1

    def prepare(self) -> None:
        """Make the first window's log-Mel now, in the calling thread (the server's Mel thread), so the
        model's thread starts on the encoder: sixteen served clips' Mels were ~5 % of the scheduler
        thread's time. The same numbers either way: the source keeps what it computed."""
        self.source.mel(0, min(N_FRAMES, self.content_frames))

    # ----------------------------------------------------------------------------------- start

    def start(self) -> None:
        """Language, tokenizer, clips and the initial prompt (runs on the model's thread)."""
        model, opts = self.model, self.options
        decode_options = dict(opts.decode_options)
        if decode_options.get("language") is None:
            if not model.is_multilingual:
                decode_options["language"] = "en"
            else:
                first = self.store.encode(
                    model,
                    pad_or_trim(self.source.mel(0, N_FRAMES), N_FRAMES),
                    0,
                    N_SAMPLES,
                    "language detection",
                )
                decode_options["language"], self.language_probs = detect_language_from_features(
                    model, first.audio_features
                )
                if opts.verbose is not None:
                    print(f"Detected language: {LANGUAGES[decode_options['language']].title()}")
        task = decode_options.get("task", "transcribe")
        self.tokenizer: Tokenizer = model.tokenizer.with_options(
            language=decode_options["language"], task=task
        )
        self.language = self.tokenizer.language or "en"
        decode_options["language"] = self.language
        self.base = DecodingOptions(**decode_options)
        self.temperatures = opts.temperatures

        clip_timestamps = opts.clip_timestamps
        if isinstance(clip_timestamps, str):
            clip_timestamps = [float(ts) for ts in clip_timestamps.split(",") if ts.strip()]
        seek_points = [round(ts * FRAMES_PER_SECOND) for ts in clip_timestamps] or [0]
        if len(seek_points) % 2 == 1:
            seek_points.append(self.content_frames)
        self.seek_clips = list(zip(seek_points[::2], seek_points[1::2]))
        if opts.word_timestamps and task == "translate":
            warnings.warn("Word-level timestamps on translations may not be reliable.", stacklevel=2)

        self.prompt_reset_since = 0
        self.remaining_prompt_length = model.dims.n_text_ctx // 2 - 1
        self.initial_prompt_tokens: list[int] = []
        if opts.initial_prompt is not None:
            self.initial_prompt_tokens = self.tokenizer.encode(" " + opts.initial_prompt.strip())
            self.all_tokens.extend(self.initial_prompt_tokens)
            self.remaining_prompt_length -= len(self.initial_prompt_tokens)
        self.clip_idx = 0
        self.seek = self.seek_clips[0][0]
        self.last_speech_timestamp = 0.0
        # progress in seconds of audio, on a terminal, when verbose (the CLI default)
        if opts.verbose is True and sys.stderr.isatty():
            self.bar = tqdm.tqdm(total=round(self.content_duration, 2), unit="s", leave=False)
        self.started = True

    # ----------------------------------------------------------------------------------- next window

    def next_window(self) -> WindowTask | None:
        """The next window that needs decoding, or None when the audio is done."""
        while self.clip_idx < len(self.seek_clips):
            clip_start, clip_end = self.seek_clips[self.clip_idx]
            self.seek = max(self.seek, clip_start)
            if self.seek >= clip_end:
                self.clip_idx += 1
                if self.clip_idx < len(self.seek_clips):
                    self.seek = self.seek_clips[self.clip_idx][0]
                continue
            seek = self.seek
            segment_size = min(N_FRAMES, self.content_frames - seek, clip_end - seek)
            samples = self.source.samples(seek * HOP_LENGTH, (seek + segment_size) * HOP_LENGTH)
            if samples.numel() == 0 or float(samples.abs().max()) < SILENCE_PEAK:
                self._progress(segment_size / FRAMES_PER_SECOND)
                self.seek += segment_size  # nothing was said here: no decode, no hallucination
                continue
            mel = pad_or_trim(self.source.mel(seek, seek + segment_size), N_FRAMES)
            options = fallback_options(replace(self.base, prompt=self.prompt()), self.temperatures[0])
            return WindowTask(seek, segment_size, mel, options, attempt=0)
        self._finish()
        return None

    def window_rows(self, task: WindowTask) -> WindowDecode:
        """The decoder rows for ``task``'s window (the scheduler prefills and steps them)."""
        return WindowDecode(
            self.model, self.tokenizer, task.options, task.window, self.request_id, self.generator
        )

    def prompt(self) -> list[int]:
        """The previous text this window is conditioned on (after <|startofprev|>)."""
        if self.options.carry_initial_prompt:
            ignored = max(len(self.initial_prompt_tokens), self.prompt_reset_since)
            tail = self.all_tokens[ignored:][-self.remaining_prompt_length :]
            return self.initial_prompt_tokens + tail
        return self.all_tokens[self.prompt_reset_since :]

    # ----------------------------------------------------------------------------------- window done

    def window_done(self, task: WindowTask, result: DecodingResult) -> WindowTask | None:
        """Take a window's result: a retry task at the next temperature, or None (window finished)."""
        if self.needs_fallback(result) and task.attempt + 1 < len(self.temperatures):
            attempt = task.attempt + 1
            t = self.temperatures[attempt]
            self.store.hits.append(f"fallback retry at temperature {t}: encoder output and Cross-KV reused")
            options = fallback_options(replace(self.base, prompt=task.options.prompt), t)
            return replace(task, options=options, attempt=attempt)
        self.last_cache_report = result.cache
        if task.window is not None:
            self.store.record_decode(task.window, result)  # decode ms and tokens, fallbacks included
        self.take_window(task, result)
        return None

    def needs_fallback(self, result: DecodingResult) -> bool:
        opts = self.options
        needs = False
        if (
            opts.compression_ratio_threshold is not None
            and result.compression_ratio > opts.compression_ratio_threshold
        ):
            needs = True  # too repetitive
        if opts.logprob_threshold is not None and result.avg_logprob < opts.logprob_threshold:
            needs = True  # too improbable
        if (
            opts.no_speech_threshold is not None
            and result.no_speech_prob > opts.no_speech_threshold
            and opts.logprob_threshold is not None
            and result.avg_logprob < opts.logprob_threshold
        ):
            needs = False  # silence: retrying will not help
        return needs

    def is_silence(self, result: DecodingResult) -> bool:
        opts = self.options
        if opts.no_speech_threshold is None:
            return False
        silent = result.no_speech_prob > opts.no_speech_threshold
        if opts.logprob_threshold is not None and result.avg_logprob > opts.logprob_threshold:
            silent = False  # confident text despite the no-speech score
        return silent

    def take_window(self, task: WindowTask, result: DecodingResult) -> None:
        """Segments, seek advance, words and hallucination check for a decoded window."""
        seek, segment_size = task.seek, task.segment_size
        if self.is_silence(result):
            self._progress((min(self.content_frames, seek + segment_size) - seek) / FRAMES_PER_SECOND)
            self.seek = seek + segment_size
            return
        cut = cut_segments(self.tokenizer, result, seek, segment_size, self.input_stride, self.time_precision)
        segments, self.seek = cut.segments, cut.seek
        if self.options.word_timestamps:
            if not self.align_words(task, segments, cut.single_timestamp_ending):
                return  # the window is decoded again from a later point
        if self.options.verbose:
            from whisperkv.writers import format_timestamp

            for segment in segments:
                start, end = format_timestamp(segment["start"]), format_timestamp(segment["end"])
                line = f"[{start} --> {end}] {segment['text']}"
                self.bar.write(line) if self.bar is not None else print(line)
        for segment in segments:
            if segment["start"] == segment["end"] or segment["text"].strip() == "":
                segment["text"] = ""
                segment["tokens"] = []
                segment["words"] = []
        self.all_segments.extend({"id": i, **s} for i, s in enumerate(segments, start=len(self.all_segments)))
        self.all_tokens.extend(t for s in segments for t in s["tokens"])
        if not self.options.condition_on_previous_text or result.temperature > 0.5:
            self.prompt_reset_since = len(self.all_tokens)
        self._progress((min(self.content_frames, self.seek) - seek) / FRAMES_PER_SECOND)

    def align_words(self, task: WindowTask, segments: list[dict], single_timestamp_ending: bool) -> bool:
        """Word timestamps (reusing the window's Cross-KV); False when the window must be redone."""
        from whisperkv.timing import add_word_timestamps, get_end

        opts = self.options
        time_offset = float(task.seek * HOP_LENGTH / SAMPLE_RATE)
        add_word_timestamps(
            segments=segments,
            model=self.model,
            tokenizer=self.tokenizer,
            mel=task.mel,
            num_frames=task.segment_size,
            prepend_punctuations=opts.prepend_punctuations,
            append_punctuations=opts.append_punctuations,
            last_speech_timestamp=self.last_speech_timestamp,
            window=task.window,
            store=self.store,
        )
        if not single_timestamp_ending:
            last_word_end = get_end(segments)
            if last_word_end is not None and last_word_end > time_offset:
                self.seek = round(last_word_end * FRAMES_PER_SECOND)
        if opts.hallucination_silence_threshold is not None:
            self.seek, redo = drop_hallucinations(
                segments,
                threshold=opts.hallucination_silence_threshold,
                seek=self.seek,
                previous_seek=task.seek,
                segment_size=task.segment_size,
                time_offset=time_offset,
                window_end_time=float((task.seek + N_FRAMES) * HOP_LENGTH / SAMPLE_RATE),
                content_duration=self.content_duration,
                content_frames=self.content_frames,
                last_speech_timestamp=self.last_speech_timestamp,
                single_timestamp_ending=single_timestamp_ending,
                last_word_end=get_end(segments),
            )
            if redo:
                return False
        last_word_end = get_end(segments)
        if last_word_end is not None:
            self.last_speech_timestamp = last_word_end
        return True

    # ----------------------------------------------------------------------------------- result

    def result(self) -> dict:
        output = {
            "text": self.tokenizer.decode(self.all_tokens[len(self.initial_prompt_tokens) :]),
            "segments": self.all_segments,
            "language": self.language,
        }
        if self.language_probs is not None:
            output["language_probs"] = self.language_probs
        output["cache"] = {**(self.last_cache_report or {}), "reuse": self.store.report()}
        if self.options.report_costs or self.options.encoder is not None:
            output["costs"] = self.store.costs()  # per window: every stage's ms and the bytes that crossed
        return output

    def close(self) -> None:
        """Drop the job's encoder outputs and Cross-KV (it is done, failed or cancelled)."""
        self.store.entries.clear()
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _finish(self) -> None:
        self.finished = True
        self.close()

    def _progress(self, seconds: float) -> None:
        if self.bar is not None:
            self.bar.update(seconds)
