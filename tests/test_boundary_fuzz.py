"""Property tests (hypothesis) over the boundary's parsers: nothing but their named error escapes (issue 41).

The sealed-blob parser and opener, the label (associated data) parser, the hello parser and its
authentication, the decoder's reading of a handshake answer, the worker's JSON reader and the secret
check each get arbitrary bytes and arbitrary JSON (deeply nested too). Each either accepts exactly what
was valid or raises its named error: SealedCacheError, or ValueError for the worker's handshake. Last,
the worker app itself (FastAPI's TestClient, in this process) answers every arbitrary body with a 4xx.
Examples are bounded so the module runs in seconds.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, fields

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from whisperkv.boundary.associated_data import FORMAT_VERSION, PartLabel, parse_label
from whisperkv.boundary.handshake import (
    ClientHello,
    HelloRefused,
    authenticate_hello,
    client_finish,
    parse_hello,
)
from whisperkv.boundary.keys import DIRECTION_RESPONSE, Measurement, check_secret, fresh_nonce
from whisperkv.boundary.request_body import load_json
from whisperkv.boundary.sealing import open_sealed, read_parts, seal
from whisperkv.errors import SealedCacheError

FUZZ = settings(max_examples=100, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
KEY = os.urandom(32)
SECRET = os.urandom(32)

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([1.5, -0.0, 1e300, 2.0])
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
DEEP = st.builds(
    lambda depth, opener, leaf: (opener * depth + leaf).encode(),
    st.integers(1, 5000),
    st.sampled_from(["[", '{"a":', '{"seq":', '{"shape":[']),
    st.sampled_from(["", "1", "null", "]", "}"]),
)


def _label(seq: int = 0, layer: int = -1) -> PartLabel:
    return PartLabel(
        format=FORMAT_VERSION,
        kind="cross_kv" if layer >= 0 else "features",
        weights_digest="w" * 24,
        mel_digest="m" * 24,
        window_start=0,
        window_end=480000,
        frontend="n_mels=80,n_fft=400,hop=160",
        dtype="float32",
        shape=(2, 3),
        layer=layer,
        request_id="r" * 32,
        seq=seq,
    )


LABELS = [_label(4), _label(4, 0)]
PAYLOADS = [bytes(range(24)), bytes(range(100, 124))]
BLOB = seal(KEY, DIRECTION_RESPONSE, LABELS, PAYLOADS)
LABEL_NAMES = [f.name for f in fields(PartLabel)]


@FUZZ
@given(st.binary(max_size=2000) | DEEP | st.builds(lambda tail: BLOB[:7] + tail, st.binary(max_size=300)))
def test_arbitrary_bytes_are_refused_as_a_blob(data):
    try:
        parts = read_parts(data)
    except SealedCacheError:
        pass
    else:
        assert all(isinstance(a, bytes) and isinstance(b, bytes) for a, b in parts)
    with pytest.raises(SealedCacheError):
        open_sealed(KEY, DIRECTION_RESPONSE, data, LABELS)


@FUZZ
@given(
    st.lists(st.tuples(st.integers(0, len(BLOB) - 1), st.integers(1, 255)), min_size=1, max_size=4),
    st.integers(0, len(BLOB)),
    st.binary(max_size=16),
)
def test_any_change_to_a_sealed_blob_is_refused(flips, cut, inserted):
    data = bytearray(BLOB)
    for at, xor in flips:
        data[at] ^= xor
    mutated = bytes(data[:cut]) + inserted + bytes(data[cut:])
    assume(mutated != BLOB)  # two flips of one byte may cancel
    with pytest.raises(SealedCacheError):
        open_sealed(KEY, DIRECTION_RESPONSE, mutated, LABELS)
    assert open_sealed(KEY, DIRECTION_RESPONSE, BLOB, LABELS) == PAYLOADS  # the original still opens


def _parse_or_refuse(data: bytes) -> None:
    try:
        label = parse_label(data)
    except SealedCacheError as err:
        assert err.reason.startswith("malformed blob") or err.field == "dtype", err.reason
    else:
        assert label.encode() == data  # only the one canonical encoding is ever accepted


@FUZZ
@given(st.binary(max_size=3000) | DEEP | JSON.map(lambda v: json.dumps(v).encode()))
@example(b"[" * 2000)  # under the size limit, past the JSON parser's recursion limit
@example(b'{"shape":' * 400 + b"1" + b"}" * 400)
def test_arbitrary_bytes_and_json_as_a_label(data):
    _parse_or_refuse(data)


@FUZZ
@given(st.sampled_from(LABEL_NAMES), JSON | st.integers(-(2**70), 2**70) | DEEP.map(bytes.decode))
def test_a_label_with_one_field_replaced(name, value):
    record = {**asdict(_label(3)), "shape": [2, 3]}
    record[name] = value
    try:
        data = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    except RecursionError:
        return
    _parse_or_refuse(data)


MEASUREMENT = Measurement("w" * 24, "0.1", "features")
HELLO = ClientHello("a1" * 16, fresh_nonce(), MEASUREMENT, int(time.time()))
SIGNED = HELLO.to_json(SECRET)


def _hello_outcome(body: object) -> None:
    try:
        hello, tag = parse_hello(body)
    except ValueError:
        return
    try:
        authenticate_hello(SECRET, hello, tag, time.time())
    except HelloRefused:
        return
    assert body == SIGNED  # only the hello the secret signed is authenticated


@FUZZ
@given(JSON | st.binary(max_size=500) | DEEP)
@example(b"[" * 3000)
def test_arbitrary_hello_bodies_are_value_errors(data):
    if isinstance(data, bytes):
        try:
            data = load_json(data)  # the worker's reader: ValueError for anything not JSON
        except ValueError:
            return
    _hello_outcome(data)


@FUZZ
@given(st.sampled_from(sorted(SIGNED) + ["extra"]), JSON | st.integers(-(2**70), 2**70))
def test_a_hello_with_one_field_replaced_is_not_authenticated(name, value):
    body = {**SIGNED, name: value}
    _hello_outcome(body)
    _hello_outcome({k: v for k, v in SIGNED.items() if k != name})


@FUZZ
@given(
    JSON | st.fixed_dictionaries({}, optional={"measurement": JSON, "worker_nonce": JSON, "confirm": JSON})
)
def test_arbitrary_handshake_answers_are_sealed_cache_errors(answer):
    with pytest.raises(SealedCacheError):
        client_finish(SECRET, HELLO, answer)


@FUZZ
@given(st.binary(max_size=64) | st.text(max_size=40).map(str.encode))
def test_the_secret_check_accepts_only_32_random_looking_bytes(data):
    try:
        assert check_secret(data) == data
    except ValueError:
        return
    text = set(range(0x20, 0x7F)) | {0x09, 0x0A, 0x0D}
    assert len(data) == 32 and len(set(data)) >= 16 and not set(data) <= text


@pytest.fixture(scope="module")
def worker_client(tiny_model):
    from fastapi.testclient import TestClient

    from whisperkv.boundary.worker import create_app

    with TestClient(create_app(tiny_model, SECRET, "features")) as client:
        yield client


@settings(max_examples=100, deadline=3000, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["/v1/session", "/v1/session/close", "/v1/encode"]),
    st.binary(max_size=3000)
    | DEEP.filter(lambda b: len(b) < 4000)
    | JSON.map(lambda v: json.dumps(v).encode())
    | st.builds(lambda tail: BLOB[:7] + tail, st.binary(max_size=300)),
)
def test_the_worker_answers_every_arbitrary_body_with_a_4xx(worker_client, path, body):
    answer = worker_client.post(path, content=body)  # a server exception would raise here
    assert 400 <= answer.status_code < 500, (answer.status_code, answer.text)
    assert isinstance(answer.json()["error"], str)
