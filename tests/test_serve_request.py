"""The OpenAI form -> transcribe() options mapping, field by field (no model, no server)."""

from __future__ import annotations

import io

import pytest
from starlette.datastructures import FormData, UploadFile  # noqa: E402

from whisperkv.serve.errors import APIError  # noqa: E402
from whisperkv.serve.request import parse_audio_request  # noqa: E402
from whisperkv.transcribe import DEFAULT_TEMPERATURES  # noqa: E402


def _parse(fields: list[tuple[str, str]], *, task="transcribe", multilingual=False):
    form = FormData([("file", UploadFile(io.BytesIO(b"x"), filename="a.wav")), *fields])
    return parse_audio_request(
        form,
        task=task,
        served_names=("tiny.en", "whisper-1"),
        multilingual=multilingual,
    )


def _error(fields, **kwargs) -> APIError:
    with pytest.raises(APIError) as info:
        _parse(fields, **kwargs)
    return info.value


def test_defaults_are_transcribes_not_the_clis():
    request = _parse([("model", "whisper-1")])
    assert request.options == {}  # greedy, fallback schedule: transcribe()'s own defaults
    assert request.response_format == "json" and not request.stream and request.granularities == ()


def test_openai_fields_map_to_whisper_options():
    request = _parse(
        [
            ("model", "tiny.en"),
            ("language", "English"),
            ("prompt", "Stew."),
            ("response_format", "verbose_json"),
            ("timestamp_granularities[]", "segment"),
            ("timestamp_granularities[]", "word"),
            ("stream", "true"),
        ]
    )
    assert request.options == {"language": "en", "initial_prompt": "Stew.", "word_timestamps": True}
    assert request.granularities == ("segment", "word") and request.stream


def test_temperature_zero_is_the_fallback_schedule_and_above_zero_samples_only_there():
    assert "temperature" not in _parse([("model", "whisper-1"), ("temperature", "0")]).options
    assert _parse([("model", "whisper-1"), ("temperature", "0.4")]).options["temperature"] == 0.4
    schedule = _parse([("model", "whisper-1"), ("temperature_increment_on_fallback", "0.2")]).options
    assert schedule["temperature"] == DEFAULT_TEMPERATURES
    fixed = _parse([("model", "whisper-1"), ("temperature_increment_on_fallback", "none")]).options
    assert fixed["temperature"] == 0.0
    assert _error([("model", "whisper-1"), ("temperature", "-0.1")]).param == "temperature"


def test_whisper_options_by_name_with_their_types():
    options = _parse(
        [
            ("model", "whisper-1"),
            ("beam_size", "5"),
            ("best_of", "none"),
            ("patience", "1.5"),
            ("condition_on_previous_text", "False"),
            ("word_timestamps", "true"),
            ("no_speech_threshold", "null"),
            ("suppress_tokens", "-1,50256"),
            ("hotwords", "Kubernetes"),
        ]
    ).options
    assert options == {
        "beam_size": 5,
        "best_of": None,
        "patience": 1.5,
        "condition_on_previous_text": False,
        "word_timestamps": True,
        "no_speech_threshold": None,
        "suppress_tokens": "-1,50256",
        "hotwords": "Kubernetes",
    }


@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ([("model", "whisper-1"), ("beams", "5")], 400, "beams"),
        ([("model", "whisper-1"), ("task", "translate")], 400, "task"),
        ([("model", "whisper-1"), ("beam_size", "0")], 400, "beam_size"),
        ([("model", "whisper-1"), ("beam_size", "5"), ("beam_size", "4")], 400, "beam_size"),
        ([("model", "whisper-1"), ("word_timestamps", "maybe")], 400, "word_timestamps"),
        ([("model", "whisper-1"), ("prompt", "a"), ("initial_prompt", "b")], 400, "initial_prompt"),
        ([("model", "whisper-1"), ("timestamp_granularities[]", "char")], 400, "timestamp_granularities"),
        ([("model", "whisper-1"), ("language", "de")], 400, "language"),
        ([("model", "whisper-2")], 404, "model"),
        ([], 400, "model"),
    ],
)
def test_bad_fields_name_themselves(fields, status, param):
    error = _error(fields)
    assert (error.status, error.param) == (status, param)
    assert param.split("_")[0] in error.message


def test_translation_needs_a_multilingual_model():
    assert _error([("model", "whisper-1")], task="translate").param == "model"
    assert _parse([("model", "whisper-1")], task="translate", multilingual=True).options == {
        "task": "translate"
    }
