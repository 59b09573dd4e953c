"""POST /v1/audio/transcriptions and /v1/audio/translations: form -> decoded audio -> scheduler job -> answer.

The request is checked completely (key, fields, model, audio) before a job is submitted, so a bad request
never reaches the scheduler. A full queue is a 429 with ``Retry-After``; a server that is shutting down
answers 503; a client that disconnects cancels its job.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

import numpy as np
import torch
from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response, StreamingResponse

from whisperkv import errors as engine_errors
from whisperkv.audio import SAMPLE_RATE
from whisperkv.audio_source import AudioSource
from whisperkv.engine import Job, JobHandle, TranscribeOptions
from whisperkv.errors import AudioError
from whisperkv.options_check import OptionError, check_clips_within
from whisperkv.serve.auth import require_api_key
from whisperkv.serve.errors import APIError, error_body
from whisperkv.serve.jobs import ClientDisconnected, iterate_segments, wait_for_result
from whisperkv.serve.limits import check_clip_work
from whisperkv.serve.request import check_with_model, option_error, parse_audio_request
from whisperkv.serve.responses import delta_event, done_event, error_event, format_result
from whisperkv.serve.upload import open_upload

router = APIRouter(prefix="/v1/audio", dependencies=[Depends(require_api_key)])

#: form limits besides the byte cap: one file, a bounded number of fields
MAX_FORM_FIELDS = 64
#: the seed of every job's sampling generator (see _submit)
SAMPLING_SEED = 0
_log = logging.getLogger("whisperkv.serve")


def _refuse_if_shutting_down(request: Request) -> None:
    if request.app.state.lifecycle.shutting_down:
        raise APIError(503, "the server is shutting down; retry on another instance", code="shutting_down")


def _refuse_if_queue_full(request: Request) -> None:
    """The scheduler's own check, made early from its counts (submitting checks again, under its lock)."""
    scheduler = request.app.state.scheduler
    stats = scheduler.stats()
    if stats["queue_depth"] + stats["active_jobs"] >= scheduler.max_queue:
        busy = f"{scheduler.max_queue} jobs are queued or running; try again later"
        raise _engine_error(request, engine_errors.QueueFullError(busy))


def _submit(request: Request, audio: np.ndarray | AudioSource, options: dict) -> JobHandle:
    """Make the job (options checked, its first log-Mel made by the app's Mel thread: blocking, so in a
    worker thread) and queue it.

    Sampling (temperature > 0, fallback) draws from the job's own generator seeded with
    ``SAMPLING_SEED``: a request's answer is reproducible, and equals ``transcribe()`` run alone after
    ``torch.manual_seed(SAMPLING_SEED)``, whatever else the server is doing.
    """
    scheduler = request.app.state.scheduler
    try:
        if "clip_timestamps" in options:  # a clip starting past the end holds nothing to transcribe
            n_samples = len(audio) if isinstance(audio, np.ndarray) else audio.n_samples
            check_clips_within(options["clip_timestamps"], n_samples / SAMPLE_RATE)
            settings = request.app.state.settings
            check_clip_work(options["clip_timestamps"], n_samples / SAMPLE_RATE, settings.max_audio_s)
        transcribe_options = TranscribeOptions.from_dict(options)
    except OptionError as err:
        raise option_error(err) from None
    except ValueError as err:  # the engine's checks of option combinations: messages written to be read
        raise APIError(400, str(err)) from None
    try:
        job = Job(
            request.app.state.model,
            audio,
            transcribe_options,
            f"req-{uuid.uuid4().hex}",
            generator=torch.Generator().manual_seed(SAMPLING_SEED),
        )
        request.app.state.mel_thread.submit(job.prepare).result()
        return scheduler.submit_job(job)
    except engine_errors.WhisperKVError as err:
        raise _engine_error(request, err) from None


def _engine_error(request: Request, err: Exception) -> APIError:
    queue_full = getattr(engine_errors, "QueueFullError", ())
    shutting_down = getattr(engine_errors, "ShuttingDownError", ())
    if queue_full and isinstance(err, queue_full):
        retry = str(request.app.state.settings.retry_after_s)
        return APIError(429, f"the queue is full: {err}", code="queue_full", headers={"Retry-After": retry})
    if shutting_down and isinstance(err, shutting_down):
        return APIError(503, "the server is shutting down; retry on another instance", code="shutting_down")
    if isinstance(err, AudioError):
        return APIError(400, f"bad audio: {err.reason}", param="file", code="invalid_audio")
    if isinstance(err, engine_errors.WhisperKVError):
        return APIError(400, str(err))  # the engine's own refusals, written to be read
    # anything else failing a job is the server's fault: said in one log line, never in the body
    _log.error("a job failed: %s: %s", type(err).__name__, err)
    return APIError(500, "the transcription failed on the server", code="server_error")


async def _handle(request: Request, task: str) -> Response:
    _refuse_if_shutting_down(request)
    settings = request.app.state.settings
    model = request.app.state.model
    async with request.form(max_files=1, max_fields=MAX_FORM_FIELDS) as form:
        parsed = parse_audio_request(
            form,
            task=task,
            served_names=settings.served_names,
            multilingual=model.is_multilingual,
            limits=settings.limits,
        )
        await check_with_model(parsed, model, settings.limits)
        _refuse_if_queue_full(request)  # before the upload is decoded: a 429 costs no decoding
        audio = await run_in_threadpool(
            open_upload, parsed.upload, settings.max_upload_bytes, settings.max_audio_s, model.dims.n_mels
        )
    _refuse_if_shutting_down(request)
    duration = (len(audio) if isinstance(audio, np.ndarray) else audio.n_samples) / SAMPLE_RATE
    handle = await run_in_threadpool(_submit, request, audio, parsed.options)
    del audio  # the job holds what it needs
    if parsed.stream:
        return StreamingResponse(_events(request, handle), media_type="text/event-stream")
    try:
        result = await wait_for_result(handle, request.receive)
    except ClientDisconnected:
        return Response(status_code=499)  # nobody reads it; counted in the metrics as a hang-up
    except (engine_errors.WhisperKVError, ValueError) as err:
        raise _engine_error(request, err) from None
    return format_result(result, parsed, duration)


async def _events(request: Request, handle) -> AsyncIterator[bytes]:
    """``transcript.text.delta`` per finished segment, then ``transcript.text.done`` (or an error event)."""
    try:
        async for segment in iterate_segments(handle):
            yield delta_event(segment)
        try:
            result = await wait_for_result(handle, None)  # Starlette watches the client while streaming
        except (engine_errors.WhisperKVError, ValueError) as err:
            api_error = _engine_error(request, err)
            yield error_event(
                error_body(api_error.status, api_error.message, api_error.param, api_error.code)
            )
            return
        yield done_event(result)
    finally:
        if not handle.done:
            handle.cancel()  # the client went away mid-stream (Starlette cancelled this generator)


@router.post("/transcriptions")
async def transcriptions(request: Request) -> Response:
    """OpenAI's ``audio.transcriptions.create``."""
    return await _handle(request, "transcribe")


@router.post("/translations")
async def translations(request: Request) -> Response:
    """OpenAI's ``audio.translations.create``: any language in, English text out."""
    return await _handle(request, "translate")
