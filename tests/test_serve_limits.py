"""Hostile options (issue 41): the work one request may ask for is bounded by the server's RequestLimits,
and every option goes through the checker ``transcribe()`` and the CLI use. Each hostile request is
refused with a 400 naming its field (never a 500, never Python's own exception text), fast, and the good
request after it is answered exactly as it was alone.
"""

from __future__ import annotations

import argparse
import time

import pytest

from tests.conftest import require_oracle, speech_audio
from tests.test_bad_inputs import run  # noqa: F401 - the in-process CLI fixture
from tests.test_serve_harness import auth, make_app, write_wav
from whisperkv.options_check import (
    MAX_FALLBACK_TEMPERATURES,
    OptionError,
    check_clips_within,
    check_transcribe_options,
    fallback_schedule,
)
from whisperkv.serve.settings import RequestLimits

require_oracle("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from whisperkv.serve import ServeSettings, create_app  # noqa: E402

TRANSCRIPTIONS = "/v1/audio/transcriptions"
SHORT_S = 3.0
#: a hostile request is refused within this many seconds (the work it asked for took 15-52 s)
FAST_S = 2.0
#: words of Python's own exception texts that must never reach a client
RAW_PYTHON = ("Traceback", "cannot convert", "could not convert", "invalid literal", "Error:", "Exception")
DEFAULTS = RequestLimits()


@pytest.fixture(scope="module")
def short_wav(tmp_path_factory) -> bytes:
    waveform = speech_audio("en/jfk.flac", SHORT_S)
    return write_wav(tmp_path_factory.mktemp("limits") / "short.wav", waveform).read_bytes()


@pytest.fixture(scope="module")
def client(tiny_model):
    with TestClient(make_app(tiny_model), raise_server_exceptions=False) as http:
        yield http


def _post(http: TestClient, wav: bytes, fields: dict, name: str = "short.wav"):
    files = {"file": (name, wav, "audio/wav")}
    return http.post(TRANSCRIPTIONS, files=files, data={"model": "whisper-1", **fields}, headers=auth())


@pytest.fixture(scope="module")
def solo(client, short_wav) -> str:
    answer = _post(client, short_wav, {})
    assert answer.status_code == 200, answer.text
    text = answer.json()["text"]
    assert "fellow Americans" in text
    return text


def _assert_refused(response, param: str, *words: str) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    message = error["message"]
    assert param in message, message  # the field named
    for word in words:
        assert word in message, (word, message)
    for raw in RAW_PYTHON:
        assert raw not in message, message
    return error


# the requests of issue 41, each with the field it must be refused by and words its message must hold
HOSTILE = [
    # the work one request asks for
    ({"beam_size": "64"}, "beam_size", f"at most {DEFAULTS.max_beam_size}", "--max_beam_size"),
    ({"best_of": "100", "temperature": "0.5"}, "best_of", "--max_best_of"),
    ({"temperature_increment_on_fallback": "1e-6"}, "temperature_increment_on_fallback", "1,000,002"),
    ({"temperature_increment_on_fallback": "1e-300"}, "temperature_increment_on_fallback", "--max_temp"),
    ({"temperature_increment_on_fallback": "0.05"}, "temperature_increment_on_fallback", "21 temperatures"),
    ({"prompt": "a" * 20_000}, "prompt", "20,000 characters", "--max_prompt_tokens"),
    ({"initial_prompt": "word " * 260}, "initial_prompt", "260 tokens", "--max_prompt_tokens"),
    ({"prompt": "a" * 1300}, "prompt", "tokens", "--max_prompt_tokens"),  # one long word: BPE's worst
    ({"hotwords": "x " * 1000}, "hotwords", "characters"),
    ({"prefix": "word " * 260}, "prefix", "260 tokens"),
    ({"sample_len": "100000"}, "sample_len", "--max_sample_len"),
    ({"sample_len": "300"}, "sample_len", "--max_sample_len"),
    # options the server used to let through that transcribe() and the CLI refuse
    ({"clip_timestamps": "5,1"}, "clip_timestamps", "not after its start"),
    ({"clip_timestamps": "-3"}, "clip_timestamps", "at least 0"),
    ({"clip_timestamps": "1000"}, "clip_timestamps", "end of the audio", "3 s"),
    ({"clip_timestamps": "0,1,3"}, "clip_timestamps", "end of the audio"),
    ({"clip_timestamps": ",".join(["0,0.5"] * 400)}, "clip_timestamps", "400 windows", "--max_audio_s"),
    ({"suppress_tokens": "-5"}, "suppress_tokens", "-5"),
    ({"suppress_tokens": "99999999"}, "suppress_tokens", "99999999", "51864"),
    ({"max_initial_timestamp": "-1"}, "max_initial_timestamp", "at least 0"),
    ({"compression_ratio_threshold": "-1"}, "compression_ratio_threshold", "at least 0"),
    ({"no_speech_threshold": "1.5"}, "no_speech_threshold", "between 0 and 1"),
    ({"hallucination_silence_threshold": "0"}, "hallucination_silence_threshold", "above 0"),
    # nan and inf, for every float option
    ({"logprob_threshold": "nan"}, "logprob_threshold", "finite"),
    ({"no_speech_threshold": "nan"}, "no_speech_threshold", "finite"),
    ({"compression_ratio_threshold": "NaN"}, "compression_ratio_threshold", "finite"),
    ({"max_initial_timestamp": "nan"}, "max_initial_timestamp", "finite"),
    ({"hallucination_silence_threshold": "inf"}, "hallucination_silence_threshold", "finite"),
    ({"patience": "nan", "beam_size": "2"}, "patience", "finite"),
    ({"length_penalty": "-inf"}, "length_penalty", "finite"),
    ({"temperature": "nan"}, "temperature", "finite"),
    ({"temperature_increment_on_fallback": "nan"}, "temperature_increment_on_fallback", "finite"),
    ({"temperature_increment_on_fallback": "inf"}, "temperature_increment_on_fallback", "finite"),
    # numbers too long to be numbers
    ({"beam_size": "9" * 5000}, "beam_size", "invalid value"),
    ({"temperature": "1e999"}, "temperature", "finite"),
]


HOSTILE_CASES = [(fields, param, words) for fields, param, *words in HOSTILE]
HOSTILE_IDS = [f"{k}={v[:12]}" for fields, *_ in HOSTILE for k, v in list(fields.items())[:1]]


@pytest.mark.parametrize(("fields", "param", "words"), HOSTILE_CASES, ids=HOSTILE_IDS)
def test_hostile_option_is_a_named_400_fast(client, short_wav, fields, param, words):
    started = time.monotonic()
    refused = _post(client, short_wav, fields)
    elapsed = time.monotonic() - started
    _assert_refused(refused, param, *words)
    assert elapsed < FAST_S, f"refused after {elapsed:.2f} s"
    assert client.get("/health").status_code == 200


def test_a_good_request_after_the_hostile_ones_equals_its_solo_answer(client, short_wav, solo):
    for fields, *_ in HOSTILE:
        assert _post(client, short_wav, fields).status_code == 400
    assert _post(client, short_wav, {}).json()["text"] == solo


@pytest.mark.slow
@pytest.mark.parametrize(("fields", "param", "words"), HOSTILE_CASES, ids=HOSTILE_IDS)
def test_a_good_request_after_each_hostile_one_equals_its_solo_answer(
    client, short_wav, solo, fields, param, words
):
    _assert_refused(_post(client, short_wav, fields), param, *words)
    after = _post(client, short_wav, {})
    assert after.status_code == 200 and after.json()["text"] == solo


def test_nul_in_the_file_name_is_a_400_not_a_500(client, short_wav, solo):
    boundary = "whisperkvlimits"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a\0b.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n"
        ).encode()
        + short_wav
        + f"\r\n--{boundary}--\r\n".encode()
    )
    headers = {**auth(), "content-type": f"multipart/form-data; boundary={boundary}"}
    _assert_refused(client.post(TRANSCRIPTIONS, content=body, headers=headers), "file", "control character")
    assert _post(client, short_wav, {}).json()["text"] == solo


def test_at_the_limits_is_served(client, short_wav):
    fields = {
        "beam_size": str(DEFAULTS.max_beam_size),
        "sample_len": str(DEFAULTS.max_sample_len),
        "prompt": "word " * 100,
        "temperature_increment_on_fallback": "0.1",  # 11 temperatures
        "clip_timestamps": "0,2.5",
    }
    answer = _post(client, short_wav, fields)
    assert answer.status_code == 200, answer.text
    assert answer.json()["text"].strip()


def test_limits_are_the_servers_settings(tiny_model, short_wav):
    from whisperkv.engine import Scheduler

    limits = RequestLimits(max_beam_size=2, max_best_of=3, max_temperatures=2, max_prompt_tokens=5)
    app = create_app(tiny_model, Scheduler(tiny_model), ServeSettings(api_key="test-key", limits=limits))
    with TestClient(app, raise_server_exceptions=False) as http:
        _assert_refused(
            _post(http, short_wav, {"beam_size": "3"}), "beam_size", "at most 2", "--max_beam_size"
        )
        best_of = _post(http, short_wav, {"best_of": "4", "temperature": "0.5"})
        _assert_refused(best_of, "best_of", "at most 3")
        schedule = _post(http, short_wav, {"temperature_increment_on_fallback": "0.5"})  # 0, 0.5, 1
        _assert_refused(schedule, "temperature_increment_on_fallback", "3 temperatures", "at most 2")
        _assert_refused(
            _post(http, short_wav, {"prompt": "one two three four five six"}), "prompt", "6 tokens"
        )
        assert _post(http, short_wav, {"prompt": "one two three four five"}).status_code == 200


def test_overlapping_clips_ask_no_more_windows_than_the_longest_upload(tiny_model, short_wav):
    from whisperkv.engine import Scheduler

    settings = ServeSettings(api_key="test-key", max_audio_s=60.0)  # two windows of 30 s
    with TestClient(create_app(tiny_model, Scheduler(tiny_model), settings)) as http:
        refused = _post(http, short_wav, {"clip_timestamps": "0,1,0,1,0,1"})
        _assert_refused(refused, "clip_timestamps", "3 windows", "at most 2 windows", "--max_audio_s")
        assert _post(http, short_wav, {"clip_timestamps": "0,1,0,1"}).status_code == 200


# ---------------------------------------------------------------------------------------------------
# the serve flags: a bad value is refused by name at startup, exit 2


def _serve_args(*argv: str) -> argparse.Namespace:
    from whisperkv.cli import build_parser

    return build_parser().parse_args(["serve", *argv])


@pytest.mark.parametrize("flag", [f"--{name}" for name in vars(DEFAULTS)])
@pytest.mark.parametrize("value", ["nan", "-1", "0", "abc", "1.5", "inf"])
def test_bad_limit_flag_exits_2_naming_it(capsys, flag, value):
    with pytest.raises(SystemExit) as exit_:
        _serve_args(f"{flag}={value}")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "Traceback" not in err


def test_limit_flags_make_the_settings():
    from whisperkv.serve.limits import limits_from_args

    assert limits_from_args(_serve_args()) == DEFAULTS
    assert limits_from_args(_serve_args("--max_beam_size", "3", "--max_prompt_tokens", "50")) == (
        RequestLimits(max_beam_size=3, max_prompt_tokens=50)
    )


# ---------------------------------------------------------------------------------------------------
# the checker itself (what the CLI and transcribe() get too)


def test_fallback_schedule_is_measured_before_it_is_built():
    from whisperkv.transcribe import DEFAULT_TEMPERATURES

    assert fallback_schedule(0.0, 0.2) == tuple(DEFAULT_TEMPERATURES)
    assert fallback_schedule(0.5, None) == (0.5,) and fallback_schedule(1.5, 0.2) == (1.5,)
    assert len(fallback_schedule(0.0, 0.001)) == MAX_FALLBACK_TEMPERATURES
    started = time.monotonic()
    for tiny_step in (1e-6, 1e-300, 5e-324):
        with pytest.raises(OptionError) as info:
            fallback_schedule(0.0, tiny_step)
        assert info.value.option == "temperature_increment_on_fallback"
    assert time.monotonic() - started < 0.5
    for bad in (float("nan"), float("inf"), 0.0, -0.1):
        with pytest.raises(OptionError, match="temperature_increment_on_fallback"):
            fallback_schedule(0.0, bad)


def test_cli_tiny_fallback_step_is_a_usage_error_at_once(run, speech_dir, tmp_path):  # noqa: F811
    started = time.monotonic()
    code, _, err = run(
        "transcribe", speech_dir / "en" / "jfk.flac", "-o", tmp_path / "o",
        "--temperature_increment_on_fallback", "1e-6",
    )  # fmt: skip
    assert code == 2 and time.monotonic() - started < FAST_S
    assert "argument --temperature_increment_on_fallback" in err and "1,000,002" in err
    assert run.loads == [] and not (tmp_path / "o").exists()


def test_sample_len_is_bounded_by_the_models_text_context(tiny_model, tmp_path):
    check_transcribe_options(tiny_model, sample_len=448)
    with pytest.raises(OptionError, match="448") as info:
        tiny_model.transcribe(str(tmp_path / "missing.wav"), sample_len=449)
    assert info.value.option == "sample_len"


def test_clips_must_start_inside_the_audio():
    check_clips_within("0,5.5,7", 10.0)
    check_clips_within([0.0, 20.0], 10.0)  # an end past the audio is the audio's end, as in openai-whisper
    for clips in ("10", "0,1,12", [10.5]):
        with pytest.raises(OptionError, match="end of the audio"):
            check_clips_within(clips, 10.0)


def test_an_unexpected_exception_is_a_generic_500(tiny_model):
    """The catch-all handler: a route that fails unexpectedly answers OpenAI's shape, its text unsaid."""
    from whisperkv.engine import Scheduler

    app = create_app(tiny_model, Scheduler(tiny_model), ServeSettings())

    @app.get("/test-only/boom")
    async def boom():
        raise RuntimeError("secret internal detail")

    with TestClient(app, raise_server_exceptions=False) as http:
        answer = http.get("/test-only/boom")
    assert answer.status_code == 500
    assert answer.json()["error"]["type"] == "server_error"
    assert "secret" not in answer.text and "Traceback" not in answer.text


def test_an_error_repeats_at_most_a_few_characters_of_a_huge_value(client, short_wav):
    for field in ("beam_size", "language", "response_format", "model"):
        answer = _post(client, short_wav, {field: "x" * 500_000})
        assert answer.status_code in (400, 404), answer.text
        error = answer.json()["error"]
        assert error["param"] == field and len(error["message"]) < 300, error["message"][:300]
        assert "500,000 characters" in error["message"]
