"""Sealing, labels, handshake and replay guard of the trust boundary (issue 11), in memory.

The randomized test mutates sealed blobs ≥ 1,000 times; every mutation must be refused with a
SealedCacheError, and none may open to a tensor other than the one sealed.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import replace

import pytest
import torch

from whisperkv.audio import N_FRAMES, N_SAMPLES, load_audio, log_mel_spectrogram, pad_or_trim
from whisperkv.boundary.associated_data import FORMAT_VERSION, PartLabel, check_label, parse_label
from whisperkv.boundary.client import RemoteEncoder
from whisperkv.boundary.costs import crossing_bytes, crossing_table
from whisperkv.boundary.handshake import (
    ClientHello,
    authenticate_hello,
    client_finish,
    parse_hello,
    worker_answer,
)
from whisperkv.boundary.keys import (
    DIRECTION_REQUEST,
    DIRECTION_RESPONSE,
    derive_session_key,
    fresh_nonce,
    measure,
    read_secret,
)
from whisperkv.boundary.protocol import request_label, response_labels
from whisperkv.boundary.replay import DecoderSequence, WorkerSequence
from whisperkv.boundary.sealing import open_sealed, seal, tensor_bytes, tensor_from_bytes
from whisperkv.boundary.worker import WorkerState, encode_window
from whisperkv.errors import CacheReuseError, SealedCacheError
from whisperkv.model.dims import KNOWN_DIMS


def _label(seq: int = 0, layer: int = -1, request_id: str = "r" * 32, **changes) -> PartLabel:
    base = PartLabel(
        format=FORMAT_VERSION,
        kind="cross_kv" if layer >= 0 else "features",
        weights_digest="w" * 24,
        mel_digest="m" * 24,
        window_start=0,
        window_end=480000,
        frontend="n_mels=80,n_fft=400,hop=160",
        dtype="float32",
        shape=(2, 3, 4),
        layer=layer,
        request_id=request_id,
        seq=seq,
    )
    return replace(base, **changes)


def _small_blob(key: bytes, seq: int, generator: torch.Generator) -> tuple[bytes, list[PartLabel], list]:
    labels = [_label(seq), _label(seq, layer=0), _label(seq, layer=1)]
    tensors = [torch.randn(2, 3, 4, generator=generator) for _ in labels]
    return seal(key, DIRECTION_RESPONSE, labels, [tensor_bytes(t) for t in tensors]), labels, tensors


def test_seal_open_roundtrip_and_labels_checked_by_name():
    key = os.urandom(32)
    blob, labels, tensors = _small_blob(key, 5, torch.Generator().manual_seed(1))
    opened = open_sealed(key, DIRECTION_RESPONSE, blob, labels)
    for payload, label, tensor in zip(opened, labels, tensors):
        assert torch.equal(tensor_from_bytes(payload, label), tensor)
    for field, value in [("mel_digest", "x" * 24), ("window_end", 1), ("seq", 6), ("request_id", "q" * 32)]:
        with pytest.raises(SealedCacheError, match=f"field '{field}' differs") as err:
            open_sealed(key, DIRECTION_RESPONSE, blob, [replace(lb, **{field: value}) for lb in labels])
        assert err.value.field == field and isinstance(err.value, CacheReuseError)
    with pytest.raises(SealedCacheError, match="authentication failed"):
        open_sealed(os.urandom(32), DIRECTION_RESPONSE, blob, labels)  # another key
    with pytest.raises(SealedCacheError, match="authentication failed"):
        open_sealed(key, DIRECTION_REQUEST, blob, labels)  # a response cannot pass as a request


def test_label_is_canonical_and_strict():
    label = _label(3, layer=2)
    assert parse_label(label.encode()) == label
    assert label.encode() == _label(3, layer=2).encode()
    for bad in [b"{}", b"not json", label.encode().replace(b'"seq":3', b'"seq":"3"'), b" " + label.encode()]:
        with pytest.raises(SealedCacheError, match="malformed blob"):
            parse_label(bad)
    with pytest.raises(SealedCacheError, match="replayed or reordered blob: .*'seq'"):
        check_label(_label(2), _label(3))


def _mutations(blob: bytes, other: bytes, rng: random.Random) -> bytes:
    """One random change to ``blob``; ``other`` is a valid blob of another window or session."""
    kind = rng.randrange(9)
    data = bytearray(blob)
    if kind == 0:  # flip one bit anywhere
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    elif kind == 1:  # truncate
        del data[rng.randrange(len(data)) :]
    elif kind == 2:  # extend
        data += os.urandom(rng.randrange(1, 64))
    elif kind == 3:  # overwrite a run with random bytes
        i = rng.randrange(len(data))
        n = min(len(data) - i, rng.randrange(1, 32))
        data[i : i + n] = bytes((b + rng.randrange(1, 256)) % 256 for b in data[i : i + n])
    elif kind == 4:  # the other blob whole (replay of another window / session)
        data = bytearray(other)
    elif kind == 5:  # splice: head of one, tail of the other
        cut = rng.randrange(1, min(len(data), len(other)))
        data = bytearray(blob[:cut] + other[cut:])
    elif kind == 6:  # swap two parts (reorder layers)
        data = bytearray(_reparts(blob, lambda p: [p[0], p[2], p[1]]))
    elif kind == 7:  # one part taken from the other blob
        i = rng.randrange(3)
        theirs = _split(other)
        data = bytearray(_reparts(blob, lambda p: [theirs[j] if j == i else p[j] for j in range(3)]))
    else:  # drop or duplicate a part
        data = bytearray(_reparts(blob, lambda p: p[:2] if rng.random() < 0.5 else [*p, p[0]]))
    return bytes(data)


def _split(blob: bytes) -> list[bytes]:
    from whisperkv.boundary.sealing import read_parts

    out = []
    for label, ct in read_parts(blob):
        out.append(len(label).to_bytes(4, "big") + label + len(ct).to_bytes(4, "big") + ct)
    return out


def _reparts(blob: bytes, rearrange) -> bytes:
    parts = rearrange(_split(blob))
    return blob[:4] + bytes([blob[4]]) + len(parts).to_bytes(2, "big") + b"".join(parts)


def test_randomized_mutations_all_refused():
    """1,200 random mutations of sealed blobs: 100 % refused, 0 opened to other tensors."""
    rng = random.Random(11)
    gen = torch.Generator().manual_seed(0)
    key, other_key = os.urandom(32), os.urandom(32)
    tried = refused = wrong = 0
    for trial in range(1200):
        seq = trial % 7
        blob, labels, tensors = _small_blob(key, seq, gen)
        source = rng.choice(["window", "session"])  # the other blob: next window, or another session's key
        other = _small_blob(
            key if source == "window" else other_key, seq + 1 if source == "window" else seq, gen
        )[0]
        mutated = _mutations(blob, other, rng)
        if mutated == blob:
            continue
        tried += 1
        try:
            opened = open_sealed(key, DIRECTION_RESPONSE, mutated, labels)
        except SealedCacheError:
            refused += 1
            continue
        wrong += any(
            not torch.equal(tensor_from_bytes(p, lb), t) for p, lb, t in zip(opened, labels, tensors)
        )
    assert refused >= 1000 and refused == tried and wrong == 0


def test_decoder_sequence_opens_each_window_once():
    seq = DecoderSequence()
    first, second = seq.issue(), seq.issue()
    seq.accept(first)
    with pytest.raises(SealedCacheError, match="already opened"):
        seq.accept(first)
    with pytest.raises(SealedCacheError, match="never asked"):
        seq.accept(second + 1)
    worker = WorkerSequence()
    worker.admit(0)
    worker.admit(2)
    with pytest.raises(SealedCacheError, match="replayed or reordered request"):
        worker.admit(1)


def test_handshake_binds_secret_and_measurement(tiny_model):
    secret = os.urandom(32)
    own = measure(tiny_model, "features")
    hello = ClientHello("a1" * 16, fresh_nonce(), own)
    parsed, tag = parse_hello(hello.to_json(secret))
    authenticate_hello(secret, parsed, tag, time.time())  # the hello proves the secret
    worker_key, answer = worker_answer(secret, parsed, own)
    assert client_finish(secret, hello, answer) == worker_key

    _, answer = worker_answer(os.urandom(32), parsed, own)  # another secret
    with pytest.raises(SealedCacheError, match="key confirmation failed"):
        client_finish(secret, hello, answer)
    other_weights = replace(own, weights_digest="0" * 24)
    _, honest = worker_answer(secret, parsed, other_weights)
    with pytest.raises(SealedCacheError, match="worker measurement 'weights_digest' differs"):
        client_finish(secret, hello, honest)
    lying = {**honest, "measurement": own.to_dict()}  # claims our weights, derived its key from its own
    with pytest.raises(SealedCacheError, match="key confirmation failed"):
        client_finish(secret, hello, lying)
    _, cross = worker_answer(secret, parsed, replace(own, carry="cross_kv"))
    with pytest.raises(SealedCacheError, match="worker measurement 'carry' differs"):
        client_finish(secret, hello, cross)
    # fresh nonces: the same secret and measurement give another key in another session
    again = derive_session_key(secret, fresh_nonce(), fresh_nonce(), hello.request_id, own)
    assert again != worker_key
    signed = hello.to_json(secret)
    for bad in [{}, {**signed, "client_nonce": "00"}, {**signed, "request_id": "x/y"}]:
        with pytest.raises(ValueError):
            parse_hello(bad)


def _secret_file(path, data: bytes, mode: int = 0o600):
    path.write_bytes(data)
    path.chmod(mode)
    return path


def test_secret_file_errors(tmp_path):
    """The secret is 32 random bytes (raw, or 64 hex digits), in a file only its owner can read."""
    raw = os.urandom(32)
    assert read_secret(_secret_file(tmp_path / "raw", raw)) == raw
    assert read_secret(_secret_file(tmp_path / "hex", raw.hex().encode() + b"\n")) == raw
    refused = {
        "short": (os.urandom(16), 0o600, "16 bytes; the secret is exactly 32 random bytes"),
        "long": (os.urandom(33), 0o600, "33 bytes; the secret is exactly 32 random bytes"),
        "passphrase": (b"correct horse battery staple!\n", 0o600, "holds text .*a passphrase"),
        "32 printable": (b"k" * 32, 0o600, r"holds text \(32 characters"),
        "pattern": (bytes(range(8)) * 4, 0o600, "8 distinct byte values: a pattern"),
        "hex of a pattern": (bytes(32).hex().encode(), 0o600, "1 distinct byte values"),
        "world-readable": (raw, 0o644, r"accessible to group or others \(mode 644\); .*chmod 600"),
        "group-readable": (raw, 0o640, "accessible to group or others"),
    }
    for name, (data, mode, message) in refused.items():
        with pytest.raises(ValueError, match=message):
            read_secret(_secret_file(tmp_path / name.replace(" ", "-"), data, mode))
    with pytest.raises(ValueError, match="secret file .*missing: No such file"):
        read_secret(tmp_path / "missing")
    with pytest.raises(ValueError, match="not a regular file"):
        read_secret(tmp_path)
    for secret in [b"s" * 32, os.urandom(31), "x" * 32]:
        with pytest.raises(ValueError, match="RemoteEncoder secret"):
            RemoteEncoder("http://127.0.0.1:9", secret)


@pytest.fixture(scope="module")
def jfk_window(speech_dir, tiny_model):
    mel = log_mel_spectrogram(load_audio(str(speech_dir / "en" / "jfk.flac")), 80, padding=N_SAMPLES)
    return pad_or_trim(mel, N_FRAMES).unsqueeze(0)


@pytest.fixture(scope="module")
def jfk_local(tiny_model, jfk_window):
    """The window's encoder output and Cross-KV computed in this process, once."""
    features = tiny_model.embed_audio(jfk_window)
    provenance = tiny_model.encoder_provenance(jfk_window, 0, N_SAMPLES)
    return features, tiny_model.decoder.project_cross_kv(features, provenance)


def _real_blob(model, mel, carry: str, seq: int = 0):
    """A real worker answer for ``mel`` (no HTTP): key, the labels the decoder expects, the blob."""
    secret = os.urandom(32)
    state = WorkerState(model, secret, measure(model, carry))
    key = os.urandom(32)
    state.open_session("b" * 32, key)
    for s in range(seq):
        state.session("b" * 32).sequence.admit(s)
    provenance = model.encoder_provenance(mel, 0, N_SAMPLES)
    asked = request_label(model, provenance, "b" * 32, seq)
    body = seal(key, DIRECTION_REQUEST, [asked], [tensor_bytes(mel)])
    blob, costs = encode_window(state, body)
    return key, response_labels(model, asked, carry), blob, state, body, costs


@pytest.mark.parametrize("carry", ["features", "cross_kv"])
def test_real_blobs_open_bit_exact_and_mutations_refused(tiny_model, jfk_window, jfk_local, carry):
    key, expected, blob, state, body, costs = _real_blob(tiny_model, jfk_window, carry)
    assert costs["encoder"] > 0 and costs["seal"] > 0
    payloads = open_sealed(key, DIRECTION_RESPONSE, blob, expected)
    features, local = jfk_local
    if carry == "features":
        assert torch.equal(tensor_from_bytes(payloads[0], expected[0]), features)
        assert len(blob) - features.numel() * 4 < 1024  # the label and tag add less than 1 KB
    else:
        for payload, label, kv in zip(payloads, expected, local):
            opened = tensor_from_bytes(payload, label)
            assert torch.equal(opened[0], kv.key) and torch.equal(opened[1], kv.value)
    with pytest.raises(SealedCacheError, match="replayed or reordered request"):
        encode_window(state, body)  # the worker refuses the same request twice
    rng = random.Random(3)
    data = bytearray(blob)
    for _ in range(60 if carry == "features" else 25):  # flips across the whole blob, in place
        i = rng.randrange(len(data))
        bit = 1 << rng.randrange(8)
        data[i] ^= bit
        with pytest.raises(SealedCacheError):
            open_sealed(key, DIRECTION_RESPONSE, bytes(data), expected)
        data[i] ^= bit


def test_worker_refuses_a_window_that_is_not_what_its_label_says(tiny_model, jfk_window):
    secret = os.urandom(32)
    state = WorkerState(tiny_model, secret, measure(tiny_model, "features"))
    key = os.urandom(32)
    state.open_session("c" * 32, key)
    provenance = tiny_model.encoder_provenance(jfk_window, 0, N_SAMPLES)
    asked = request_label(tiny_model, provenance, "c" * 32, 0)
    other = jfk_window.clone()
    other[0, 0, 0] += 1.0  # sealed by the key holder, but not the window the label names
    with pytest.raises(SealedCacheError, match="does not match its label"):
        encode_window(state, seal(key, DIRECTION_REQUEST, [asked], [tensor_bytes(other)]))
    with pytest.raises(LookupError, match="no session"):
        encode_window(state, seal(key, DIRECTION_REQUEST, [replace(asked, request_id="d" * 32)], [b"x"]))


def test_crossing_bytes_from_dimensions():
    tiny = crossing_bytes(KNOWN_DIMS["tiny.en"], "float32")
    assert tiny["features"] == 1500 * 384 * 4 == 2_304_000
    assert tiny["cross_kv"] == 8 * tiny["features"] == 18_432_000
    large = crossing_bytes(KNOWN_DIMS["large-v3"], "float16")
    assert large["features"] == 3_840_000 and large["cross_kv"] == 245_760_000
    assert large["log_mel"] == 128 * 3000 * 2
    rows = crossing_table()
    assert {r["model"] for r in rows} >= {"tiny", "base", "small", "medium", "large-v3"}
    ratios = {(r["model"], r["dtype"]): r["ratio"] for r in rows}
    assert ratios["tiny.en", "float32"] == 8 and ratios["large-v3", "float16"] == 64


def test_cli_inspect_boundary_table(capsys):
    import json

    from whisperkv.cli import main

    assert main(["inspect", "--boundary", "--json"]) == 0
    rows = {(r["model"], r["dtype"]): r for r in json.loads(capsys.readouterr().out)}
    assert rows["tiny.en", "float32"]["cross_kv"] == 18_432_000
    assert rows["large-v3", "float16"]["features"] == 3_840_000
    assert main(["inspect", "--boundary"]) == 0
    assert "245.8MB" in capsys.readouterr().out
