"""Faults: every bad request gets the right status and OpenAI's error shape, and the requests around it
are still served, unchanged. Also: a full queue is 429 with Retry-After, and a client that hangs up
cancels its job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from tests.conftest import SPEECH_DIR
from tests.test_serve_harness import auth, live_server, make_app

UPLOAD_LIMIT = 2 * 2**20
JFK = SPEECH_DIR / "en" / "jfk.flac"
LONG = SPEECH_DIR / "long" / "lj001_0001-0032_concat.flac"
TRANSCRIPTIONS = "/v1/audio/transcriptions"


def _post(
    http: httpx.Client, files: dict | None, data: dict, headers: dict | None = None, path=TRANSCRIPTIONS
):
    return http.post(path, files=files, data=data, headers=auth() if headers is None else headers)


def _file(path: Path, name: str | None = None) -> dict:
    return {"file": (name or path.name, path.read_bytes(), "application/octet-stream")}


def _assert_error(response: httpx.Response, status: int, *, param=None, code=None, says: str = "") -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    assert says.lower() in error["message"].lower(), error


def _chunked_multipart(size: int, boundary: str = "whisperkvtestboundary") -> Iterator[bytes]:
    """A multipart body sent with chunked transfer (no Content-Length): only counting can stop it."""
    yield (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()
    chunk = b"\0" * 65536
    for _ in range(size // len(chunk)):
        yield chunk
    yield f"\r\n--{boundary}--\r\n".encode()


@pytest.fixture(scope="module")
def server(tiny_model) -> Iterator[str]:
    with live_server(make_app(tiny_model, max_upload_bytes=UPLOAD_LIMIT)) as url:
        yield url


def _assert_bad_uploads_refused(http: httpx.Client, flac: bytes) -> None:
    """Not audio, a cut FLAC, an empty file, over the upload limit with a length and chunked without one."""
    _assert_error(
        _post(http, {"file": ("notes.wav", b"not audio at all", "audio/wav")}, {"model": "whisper-1"}),
        400,
        param="file",
        code="invalid_audio",
        says="notes.wav",
    )
    _assert_error(
        _post(http, {"file": ("cut.flac", flac[: len(flac) // 3], "audio/flac")}, {"model": "whisper-1"}),
        400,
        param="file",
        says="truncated",
    )
    _assert_error(
        _post(http, {"file": ("empty.wav", b"", "audio/wav")}, {"model": "whisper-1"}),
        400,
        param="file",
        says="empty",
    )
    big = {"file": ("big.wav", b"\0" * (UPLOAD_LIMIT + 2**20), "audio/wav")}
    _assert_error(_post(http, big, {"model": "whisper-1"}), 413, param="file", code="upload_too_large")
    streamed = http.post(
        TRANSCRIPTIONS,
        content=_chunked_multipart(UPLOAD_LIMIT + 2**20),
        headers={**auth(), "Content-Type": "multipart/form-data; boundary=whisperkvtestboundary"},
    )
    _assert_error(streamed, 413, code="upload_too_large")


def _assert_bad_fields_refused(http: httpx.Client, audio: dict) -> None:
    """Unknown and malformed fields, a model that cannot translate or does not exist, no model, no file,
    no key or the wrong one, and a route that does not exist."""
    _assert_error(
        _post(http, audio, {"model": "whisper-1", "beam": "5"}),
        400,
        param="beam",
        code="unknown_parameter",
        says="beam",
    )
    _assert_error(_post(http, audio, {"model": "whisper-1", "beam_size": "five"}), 400, param="beam_size")
    _assert_error(_post(http, audio, {"model": "whisper-1", "beam_size": "0"}), 400, param="beam_size")
    _assert_error(
        _post(http, audio, {"model": "whisper-1", "response_format": "xml"}), 400, param="response_format"
    )
    _assert_error(_post(http, audio, {"model": "whisper-1", "temperature": "1.5"}), 400, param="temperature")
    _assert_error(_post(http, audio, {"model": "whisper-1", "language": "fr"}), 400, param="language")
    _assert_error(_post(http, audio, {"model": "whisper-1", "language": "xx"}), 400, param="language")
    _assert_error(
        _post(http, audio, {"model": "whisper-1", "timestamp_granularities[]": "word"}),
        400,
        param="timestamp_granularities",
    )
    _assert_error(
        _post(http, audio, {"model": "whisper-1"}, path="/v1/audio/translations"),
        400,
        param="model",
        says="English-only",
    )
    _assert_error(
        _post(http, audio, {"model": "gpt-4o-transcribe"}), 404, param="model", code="model_not_found"
    )
    _assert_error(_post(http, audio, {}), 400, param="model")
    _assert_error(_post(http, None, {"model": "whisper-1"}), 400, param="file")
    _assert_error(_post(http, audio, {"model": "whisper-1"}, headers={}), 401, code="invalid_api_key")
    _assert_error(
        _post(http, audio, {"model": "whisper-1"}, headers=auth("wrong")), 401, code="invalid_api_key"
    )
    _assert_error(http.get("/v1/nothing-here", headers=auth()), 404)


def test_bad_requests_answered_while_others_are_served_unchanged(server, tiny_model, speech_dir):
    good: dict = {}

    def transcribe_good() -> None:
        with httpx.Client(base_url=server, timeout=300) as http:
            good["response"] = _post(
                http, _file(JFK), {"model": "whisper-1", "response_format": "verbose_json"}
            )

    worker = threading.Thread(target=transcribe_good)
    worker.start()
    flac = JFK.read_bytes()
    with httpx.Client(base_url=server, timeout=60) as http:
        audio = _file(JFK)
        _assert_bad_uploads_refused(http, flac)
        _assert_bad_fields_refused(http, audio)
        after = _post(http, audio, {"model": "whisper-1", "response_format": "text"})
    worker.join(300)
    torch.manual_seed(0)
    solo = tiny_model.transcribe(str(JFK))
    assert after.status_code == 200 and after.text == solo["text"] + "\n"
    response = good["response"]
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["text"] == solo["text"]
    assert [(s["start"], s["end"], s["tokens"]) for s in body["segments"]] == [
        (s["start"], s["end"], s["tokens"]) for s in solo["segments"]
    ]


def _metric(http: httpx.Client, name: str) -> float:
    text = http.get("/metrics", headers=auth()).text
    return float(text.split(f"\n{name} ")[1].split()[0])


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_full_queue_is_429_with_retry_after(tiny_model, speech_dir):
    with live_server(make_app(tiny_model, max_queue=1, max_upload_bytes=16 * 2**20)) as url:
        first: dict = {}

        def long_request() -> None:
            with httpx.Client(base_url=url, timeout=600) as http:
                first["response"] = _post(http, _file(JFK), {"model": "whisper-1", "beam_size": "5"})

        worker = threading.Thread(target=long_request)
        worker.start()
        with httpx.Client(base_url=url, timeout=60) as http:
            _wait_for(lambda: _metric(http, "whisperkv_active_jobs") >= 1, 60, "the first job")
            refused = _post(http, _file(JFK), {"model": "whisper-1"})
            _assert_error(refused, 429, code="queue_full")
            assert int(refused.headers["Retry-After"]) >= 1
        worker.join(600)
        assert first["response"].status_code == 200


def test_client_disconnect_cancels_its_job(tiny_model, speech_dir):
    with live_server(make_app(tiny_model, max_upload_bytes=16 * 2**20)) as url:
        with httpx.Client(base_url=url, timeout=60) as http:
            with pytest.raises(httpx.ReadTimeout):
                http.post(
                    TRANSCRIPTIONS,
                    files=_file(LONG),
                    data={"model": "whisper-1"},
                    headers=auth(),
                    timeout=httpx.Timeout(60, read=3),
                )
            # the 3.8 min file needs far longer than this to transcribe: only a cancel ends it this fast
            _wait_for(lambda: _metric(http, "whisperkv_active_jobs") == 0, 10, "the job to be cancelled")
            steps = _metric(http, "whisperkv_decoder_steps_total")
            time.sleep(0.5)
            assert _metric(http, "whisperkv_decoder_steps_total") == steps  # nothing decodes for it any more
            ok = _post(http, _file(JFK), {"model": "whisper-1"})
            assert ok.status_code == 200 and "country" in ok.json()["text"]


def test_a_requests_log_mel_is_made_once_off_the_models_thread(tiny_model, speech_dir, monkeypatch):
    """The app's one Mel thread makes the first window's log-Mel (``Job.prepare``): the scheduler's
    thread, which every request shares, starts on the encoder, and no request thread keeps an STFT's
    buffers in its own heap."""
    import whisperkv.audio_source as audio_source

    made_in: list[str] = []
    real = audio_source.log_mel_spectrogram

    def recorded(*args, **kwargs):
        made_in.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(audio_source, "log_mel_spectrogram", recorded)
    with live_server(make_app(tiny_model, max_upload_bytes=16 * 2**20)) as url:
        with httpx.Client(base_url=url, timeout=120) as http:
            response = _post(http, _file(JFK), {"model": "whisper-1"})
    assert response.status_code == 200 and "country" in response.json()["text"]
    assert len(made_in) == 1 and made_in[0].startswith("whisperkv-mel"), made_in
