"""The Realtime event parser and message cap against hostile input, without a server.

The event parser is tried with hypothesis: any text or bytes give a ``ClientEvent`` or a
``RealtimeError``, nothing else. One event's size cap carries at most 15 s of audio whatever the buffer
cap. The socket's own handling is tests/test_realtime_hostile.py's.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_realtime_hostile import BUFFER_S, pcm
from whisperkv.serve.realtime import max_message_chars
from whisperkv.serve.realtime_events import EVENT_TYPES, ClientEvent, RealtimeError, parse_event


def test_one_event_carries_at_most_15_s_whatever_the_buffer_cap():
    def append(seconds: float) -> int:
        return len(json.dumps({"type": "input_audio_buffer.append", "audio": pcm(seconds, 24000)}))

    for buffer_s in (60.0, 3600.0):  # the default, and a generous operator's
        assert append(15) <= max_message_chars(buffer_s) < append(17)
    assert append(BUFFER_S) <= max_message_chars(BUFFER_S) < append(BUFFER_S + 2)  # a smaller buffer: lower


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=30,
)
FIELDS = st.sampled_from(["session", "audio", "event_id", "type", "format", "rate", "language", "input"])


@st.composite
def event_like(draw) -> dict:
    """Objects shaped like client events, with wrong types and values where the fields are."""
    event = {"type": draw(st.sampled_from(EVENT_TYPES) | st.text(max_size=30))}
    for name in draw(st.lists(FIELDS, max_size=4)):
        event[name] = draw(JSON)
    if draw(st.booleans()):
        transcription = {"language": draw(JSON), "prompt": draw(JSON), "confident": draw(JSON)}
        audio_input = {"format": {"rate": draw(JSON), "type": draw(JSON)}, "transcription": transcription}
        if draw(st.booleans()):
            audio_input["turn_detection"] = draw(JSON)
        event["session"] = {"type": draw(st.just("transcription") | JSON), "audio": {"input": audio_input}}
    if draw(st.booleans()):
        event["audio"] = draw(st.text(alphabet="ABCDEFGH=+/abc%", max_size=16))
    return event


MESSAGES = (
    event_like().map(json.dumps)
    | JSON.map(json.dumps)
    | st.text(max_size=200)
    | st.binary(max_size=200)
    | st.none()
    | st.integers(1, 5000).map(lambda n: "[" * n + "]" * n)
    | st.integers(1, 5000).map(
        lambda n: '{"type": "session.update", "session": ' + '{"a":' * n + "1" + "}" * n + "}"
    )
)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(MESSAGES)
def test_the_event_parser_raises_nothing_but_realtime_error(message):
    try:
        event = parse_event(message, max_bytes=100_000)
    except RealtimeError as err:
        assert err.code and str(err)
        json.dumps({"code": err.code, "message": str(err), "param": err.param, "event_id": err.event_id})
        assert err.event_id is None or isinstance(err.event_id, str)
        return
    assert isinstance(event, ClientEvent) and event.type in EVENT_TYPES
    assert isinstance(event.audio, bytes) and len(event.audio) % 2 == 0
    if event.session is not None:
        assert event.session.rate in (None, 16000, 24000)
        assert event.session.language is None or isinstance(event.session.language, str)
        assert event.session.prompt is None or isinstance(event.session.prompt, str)
        assert event.session.server_vad in (None, True, False)
