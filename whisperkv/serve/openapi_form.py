"""The OpenAPI schema the server publishes, with the audio routes' multipart form written out.

The audio routes read their form themselves (``parse_audio_request``), so FastAPI sees no body to
describe; here the schema gains it (the file and every field the parser knows, named from its own
tables), which is what a client generator or a fuzzer (schemathesis, ``tests/test_serve_fuzz.py``) needs.
How the routes parse is unchanged. The schema is served at ``/openapi.json`` behind the API key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from whisperkv.serve.request import GRANULARITIES, OPENAI_FIELDS, RESPONSE_FORMATS, WHISPER_OPTIONS

AUDIO_PATHS = ("/v1/audio/transcriptions", "/v1/audio/translations")
ERROR_STATUSES = {
    "400": "a field is wrong (named in error.param)",
    "401": "missing or incorrect API key",
    "408": "the request body did not arrive in time",
    "413": "the upload is too large",
    "429": "the queue is full (Retry-After)",
    "503": "the server is shutting down",
}
_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def _accepts(parser: Callable[[str], Any], text: str) -> bool:
    try:
        parser(text)
    except ValueError:
        return False
    return True


def option_type(parser: Callable[[str], Any]) -> str:
    """The JSON type of a text field, from what its parser takes: any text (string), true (boolean),
    0.5 (number) or only whole numbers (integer)."""
    if _accepts(parser, "text") and _accepts(parser, "0.5"):
        return "string"
    if _accepts(parser, "true"):
        return "boolean"
    return "number" if _accepts(parser, "0.5") else "integer"


def audio_form(served_names: tuple[str, ...]) -> dict[str, Any]:
    """The multipart body of a transcription or translation request."""
    properties: dict[str, Any] = {
        "file": {"type": "string", "format": "binary", "description": "the audio file"},
        "model": {
            "type": "string",
            "enum": list(served_names),
            "description": "the served model or whisper-1",
        },
        "language": {"type": "string"},
        "prompt": {"type": "string"},
        "response_format": {"type": "string", "enum": list(RESPONSE_FORMATS)},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "stream": {"type": "boolean"},
        "timestamp_granularities[]": {
            "type": "array",
            "items": {"type": "string", "enum": list(GRANULARITIES)},
        },
    }
    for name, parser in WHISPER_OPTIONS.items():  # openai-whisper's options, each parsed to its type
        properties.setdefault(name, {"type": option_type(parser)})
    assert set(OPENAI_FIELDS) <= set(properties)
    return {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "model"],
                    "properties": properties,
                    "additionalProperties": False,  # any other field is a 400 (unknown_parameter)
                }
            }
        },
    }


def server_schema(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document (built once, then cached on the app as FastAPI does)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {})
    components.setdefault("schemas", {})["Error"] = _ERROR
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    error_ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path in AUDIO_PATHS:
        operation = schema["paths"][path]["post"]
        operation["requestBody"] = audio_form(app.state.settings.served_names)
        operation["security"] = [{"bearer": []}]
        for status, why in ERROR_STATUSES.items():
            operation["responses"].setdefault(status, {"description": why, **error_ref})
    app.openapi_schema = schema
    return schema
