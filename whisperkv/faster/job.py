"""whisperkv's long-form job with faster-whisper's three differences in what a window is decoded with.

* ``multilingual=True``: the language is detected again on every window, from that window's own encoder
  output (encoded once: the scheduler decodes from the same ``EncodedWindow``), and the window is decoded
  in it — for audio whose speakers switch languages.
* ``prefix`` forces the start of the first window only (openai-whisper's loop forces it on every one).
  It is decoded as openai-whisper decodes a prefix (part of the prompt: the first sampled token is a
  timestamp, and the prefix is not in the window's text), not as CTranslate2 does (after ``<|0.00|>``,
  returned as the first tokens of the text): whisperkv's decoder has one rule for where sampling begins.
* ``initial_prompt`` may be token ids as well as text.
Everything else is ``whisperkv.engine.job.Job``, unchanged.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from whisperkv.decoding.language import detect_language_from_features
from whisperkv.engine.job import Job, WindowTask
from whisperkv.engine.options import TranscribeOptions

if TYPE_CHECKING:
    from whisperkv.decoding.options import DecodingResult
    from whisperkv.model.whisper import Whisper


class FasterJob(Job):
    """A ``Job`` that may detect each window's language, forces its prefix once, and takes prompt ids."""

    def __init__(
        self,
        model: Whisper,
        audio: Any,
        options: TranscribeOptions,
        request_id: str,
        multilingual: bool = False,
        prompt_ids: list[int] | None = None,
    ) -> None:
        super().__init__(model, audio, options, request_id)
        self.multilingual = multilingual and model.is_multilingual
        self.prompt_ids = prompt_ids
        #: each decoded window's language, by its seek (the segments' windows)
        self.window_languages: dict[int, str] = {}

    def start(self) -> None:
        super().start()
        if self.prompt_ids:
            self.initial_prompt_tokens = list(self.prompt_ids)
            self.all_tokens.extend(self.prompt_ids)
            self.remaining_prompt_length -= len(self.prompt_ids)

    def next_window(self) -> WindowTask | None:
        task = super().next_window()
        if task is None:
            return None
        if self.multilingual:
            self._use_window_language(task)
        self.window_languages[task.seek] = self.language
        return self._first_window_prefix(task)

    def window_done(self, task: WindowTask, result: DecodingResult) -> WindowTask | None:
        retry = super().window_done(task, result)
        return self._first_window_prefix(retry) if retry is not None else None

    def _first_window_prefix(self, task: WindowTask) -> WindowTask:
        if task.seek != 0 and task.options.prefix is not None:
            return replace(task, options=replace(task.options, prefix=None))
        return task

    def _use_window_language(self, task: WindowTask) -> None:
        """Encode the window now, detect its language, and decode it (and its retries) in that one."""
        task.window = self.store.encode(
            self.model, task.mel, task.window_start, task.window_end, "same window"
        )
        language, _ = detect_language_from_features(self.model, task.window.audio_features)
        if language != self.language:
            self.language = language
            self.tokenizer = self.model.tokenizer.with_options(language=language, task=self.base.task)
            self.base = replace(self.base, language=language)
        task.options = replace(task.options, language=language)
