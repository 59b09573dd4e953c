"""Hostile uploads (issue 41): a playlist or concat list never makes the server read its own disk, whatever
it is called; a compressed-silence bomb is refused by ``--max_audio_s`` in bounded memory and time; a
full queue answers 429 before anything is decoded. Every accepted format is still transcribed exactly
as ``transcribe()`` transcribes the same bytes, and a good request after each hostile one equals its
solo answer."""

from __future__ import annotations

import io
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import av
import httpx
import numpy as np
import pytest
import torch

from tests.conftest import SPEECH_DIR
from tests.test_serve_faults import _assert_error, _metric, _wait_for
from tests.test_serve_harness import auth, live_server, write_wav
from tests.test_serve_sigterm import _server

JFK = SPEECH_DIR / "en" / "jfk.flac"  # a real clip on the server's disk, for the playlists to name
LONG = SPEECH_DIR / "long" / "lj001_0001-0032_concat.flac"
TRANSCRIPTIONS = "/v1/audio/transcriptions"
AUDIO_LIMIT_S = 600  # the --max_audio_s of these servers: the bombs below hold 30 minutes
BOMB_S = 1800
UPLOAD_LIMIT = 8 * 2**20

HLS = (
    "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:11\n#EXT-X-MEDIA-SEQUENCE:0\n"
    + f"#EXTINF:11.0,\n{JFK}\n" * 5
    + "#EXT-X-ENDLIST\n"
).encode()
FFCONCAT = f"ffconcat version 1.0\nfile '{JFK}'\nfile '{JFK}'\n".encode()
CONCAT = f"file '{JFK}'\n".encode()
HOSTILE = [  # (file name the client gives, body, what the refusal must say)
    ("x.m3u8", HLS, "HLS"),
    ("x.flac", HLS, "HLS"),
    ("x.wav", b"\xef\xbb\xbf" + HLS, "HLS"),  # with a byte-order mark in front
    ("list.ffconcat", FFCONCAT, "ffconcat"),
    ("x.flac", FFCONCAT, "ffconcat"),
    ("x.mp3", CONCAT, "concat"),
    ("x.pls", f"[playlist]\nFile1={JFK}\nNumberOfEntries=1\n".encode(), "playlist"),
    ("x.mpd", b'<?xml version="1.0"?><MPD xmlns="urn:mpeg:dash:schema:mpd:2011"></MPD>', "XML"),
    ("x.ogg", b"\x00" * 64, "no known audio signature"),
]


def _post(http: httpx.Client, name: str, body: bytes, **data: str) -> httpx.Response:
    files = {"file": (name, body, "audio/flac")}
    return http.post(TRANSCRIPTIONS, files=files, data={"model": "whisper-1", **data}, headers=auth())


def encode(samples: np.ndarray, container: str, codec: str, rate: int = 16000, **options: str) -> bytes:
    """16 kHz mono int16 ``samples`` encoded by FFmpeg (PyAV) into ``container`` with ``codec``."""
    out_file = io.BytesIO()
    with av.open(out_file, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate, options=options)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return out_file.getvalue()


def silence_flac(seconds: int) -> bytes:
    """A FLAC of digital silence in the largest frames FLAC has: 30 min in ~14 KB (ratio ~4,000:1)."""
    out_file = io.BytesIO()
    with av.open(out_file, "w", format="flac") as out:
        stream = out.add_stream("flac", rate=16000, options={"compression_level": "0", "frame_size": "65535"})
        stream.layout = "mono"
        minute = np.zeros((1, 60 * 16000), dtype=np.int16)
        for _ in range(seconds // 60):
            frame = av.AudioFrame.from_ndarray(minute, format="s16", layout="mono")
            frame.sample_rate = 16000
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return out_file.getvalue()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    data = silence_flac(BOMB_S)
    assert len(data) < 64 * 1024  # a tiny upload, far under any upload limit
    return data


@pytest.fixture(scope="module")
def solo(tiny_model) -> dict:
    torch.manual_seed(0)
    return tiny_model.transcribe(str(JFK))


def _make_app(model, **scheduler_args):
    from whisperkv.engine import Scheduler
    from whisperkv.serve import ServeSettings, create_app

    settings = ServeSettings(
        model_name="tiny.en", api_key="test-key", max_upload_bytes=UPLOAD_LIMIT, max_audio_s=AUDIO_LIMIT_S
    )
    return create_app(model, Scheduler(model, **scheduler_args), settings)


@pytest.fixture(scope="module")
def server(tiny_model) -> Iterator[str]:
    with live_server(_make_app(tiny_model)) as url:
        yield url


def _assert_good_answer(http: httpx.Client, solo: dict) -> None:
    """A good request served after a hostile one: exactly its solo answer."""
    good = _post(http, JFK.name, JFK.read_bytes(), response_format="verbose_json")
    assert good.status_code == 200, good.text
    body = good.json()
    assert body["text"] == solo["text"]
    assert [s["tokens"] for s in body["segments"]] == [s["tokens"] for s in solo["segments"]]


def test_playlists_and_lists_are_refused_whatever_their_name(server, solo):
    with httpx.Client(base_url=server, timeout=120) as http:
        for name, body, says in HOSTILE:
            steps = _metric(http, "whisperkv_decoder_steps_total")
            refused = _post(http, name, body)
            _assert_error(refused, 400, param="file", code="invalid_audio", says=says)
            assert "refused" in refused.json()["error"]["message"]
            # nothing of the named clip was decoded: no job ever reached the scheduler
            assert _metric(http, "whisperkv_decoder_steps_total") == steps
            _assert_good_answer(http, solo)


def test_a_demuxer_that_opens_other_files_is_stopped_even_if_forced():
    """Defence in depth: were an HLS or concat demuxer ever chosen, the nested open is refused (no I/O
    hook but the buffer, an empty protocol whitelist), so the named clip is not read."""
    from whisperkv.audio import decode_untrusted
    from whisperkv.audio_formats import SniffedFormat
    from whisperkv.errors import AudioError

    for demuxer, body in (("hls", HLS), ("concat", FFCONCAT)):
        with pytest.raises(AudioError) as refused:
            list(decode_untrusted(lambda body=body: io.BytesIO(body), "x.flac", SniffedFormat(demuxer, {})))
        assert "refused" in refused.value.reason or "not permitted" in refused.value.reason


ENCODINGS = [  # (file name, container, codec, codec rate): the formats a client may upload
    ("a.wav", "wav", "pcm_s16le", 16000),
    ("a.flac", "flac", "flac", 16000),
    ("a.mp3", "mp3", "libmp3lame", 16000),
    ("a.opus", "ogg", "libopus", 48000),
    ("a.webm", "webm", "libopus", 48000),
    ("a.m4a", "ipod", "aac", 16000),
    ("a.aac", "adts", "aac", 16000),
    ("a.aiff", "aiff", "pcm_s16be", 16000),
]


def test_every_accepted_format_is_transcribed_as_transcribe_does(server, tiny_model, tmp_path):
    from whisperkv.audio import load_audio

    samples = np.round(load_audio(JFK) * 32767).astype(np.int16)
    with httpx.Client(base_url=server, timeout=300) as http:
        for name, container, codec, rate in ENCODINGS:
            data = encode(samples, container, codec, rate)
            served = _post(http, "upload.bin", data)  # the name says nothing: the bytes decide
            assert served.status_code == 200, (name, served.text)
            local = tmp_path / name
            local.write_bytes(data)
            torch.manual_seed(0)
            expected = tiny_model.transcribe(str(local))
            assert served.json()["text"] == expected["text"], name
            assert "ask not what your country can do for you" in expected["text"].lower(), name


def test_an_upload_over_a_minute_is_streamed_and_equals_transcribe(server, tiny_model, tmp_path, monkeypatch):
    """77 s (a clip, 55 s of digital silence, the clip again): read window by window, as the CLI reads
    the same file, and the same answer. It is decoded once: the first pass spools the samples, the scan
    and the windows read the spool (the same bits as the CLI's reading of the file); over the spool's cap
    it is decoded again from the upload's copy, with the same bits."""
    import whisperkv.serve.upload as upload
    from whisperkv.audio import N_FRAMES, load_audio
    from whisperkv.audio_source import FileSource

    clip = load_audio(JFK)
    path = write_wav(tmp_path / "long.wav", np.concatenate([clip, np.zeros(55 * 16000, np.float32), clip]))
    decodes = []
    real_decode = upload.decode_untrusted
    monkeypatch.setattr(upload, "decode_untrusted", lambda *a, **k: decodes.append(1) or real_decode(*a, **k))
    cli = FileSource(path, 80, spool_bytes=0)
    for spool_cap, decoded in ((UPLOAD_LIMIT, 1), (1000, 3)):  # 77 s need 2.5 MB of spool
        decodes.clear()
        monkeypatch.setattr(upload, "SPOOL_PER_UPLOAD_BYTE", spool_cap / UPLOAD_LIMIT)
        source = upload.open_upload(_Upload("long.wav", path.read_bytes()), UPLOAD_LIMIT, AUDIO_LIMIT_S, 80)
        assert isinstance(source, FileSource) and source.n_samples == len(load_audio(path))
        for seek in range(0, source.content_frames, N_FRAMES):
            assert torch.equal(source.mel(seek, seek + N_FRAMES), cli.mel(seek, seek + N_FRAMES)), seek
            assert torch.equal(
                source.samples(seek * 160, (seek + N_FRAMES) * 160),
                cli.samples(seek * 160, (seek + N_FRAMES) * 160),
            )
        assert len(decodes) == decoded, (
            spool_cap
        )  # the first pass; over the cap, the scan and the windows too
    with httpx.Client(base_url=server, timeout=300) as http:
        served = _post(http, "long.wav", path.read_bytes(), response_format="verbose_json")
    torch.manual_seed(0)
    expected = tiny_model.transcribe(str(path))
    assert served.status_code == 200, served.text
    assert served.json()["text"] == expected["text"]
    assert [s["tokens"] for s in served.json()["segments"]] == [s["tokens"] for s in expected["segments"]]


def test_decoding_stops_as_soon_as_the_limit_passes(bomb):
    from whisperkv.audio import decode_untrusted
    from whisperkv.audio_formats import AudioTooLongError, sniff_audio_format

    limit = 120 * 16000
    produced = 0
    with pytest.raises(AudioTooLongError):
        for block in decode_untrusted(
            lambda: io.BytesIO(bomb), "bomb", sniff_audio_format(io.BytesIO(bomb)), 16000, limit
        ):
            produced += len(block)
    assert limit - 65535 <= produced <= limit  # it stopped within one FLAC frame of the limit


def test_a_silence_bomb_is_413_naming_max_audio_s(server, bomb, solo):
    with httpx.Client(base_url=server, timeout=120) as http:
        started = time.monotonic()
        refused = _post(http, "silence.flac", bomb)
        took = time.monotonic() - started
        _assert_error(refused, 413, param="file", code="audio_too_long", says="--max_audio_s")
        assert f"{AUDIO_LIMIT_S:g} s" in refused.json()["error"]["message"]
        assert took < 60, took  # only the first 10 minutes were decoded
        print(f"413 answered in {took:.3f} s")
        _assert_good_answer(http, solo)


class _Upload:
    """What ``open_upload`` reads of a form's file part."""

    def __init__(self, name: str, data: bytes) -> None:
        self.filename = name
        self.file = io.BytesIO(data)


def test_one_huge_packet_or_frame_is_refused_before_it_is_decoded():
    """A container may hold all its audio in one packet (ratio 1:1, but decoded and resampled at once it
    would multiply): packets over 8 MB and frames over 30 s, which no real encoder makes, are refused."""
    from whisperkv.serve.errors import APIError
    from whisperkv.serve.upload import open_upload

    big = encode(np.zeros(4_500_000, np.int16), "matroska", "pcm_s16le")  # one 9 MB packet
    long_frame = np.zeros(1_000_000, np.int16)  # 1 MB of 8-bit samples at 8 kHz: one 125 s frame
    cases = [(big, "a packet of 8.6 MB"), (_eight_bit(long_frame), "a frame of 125.0 s")]
    for data, says in cases:
        with pytest.raises(APIError) as refused:
            open_upload(_Upload("x.mkv", data), 64 * 2**20, 10800, 80)
        assert refused.value.status == 400 and says in refused.value.message, refused.value.message


def _eight_bit(samples: np.ndarray) -> bytes:
    out_file = io.BytesIO()
    with av.open(out_file, "w", format="matroska") as out:
        stream = out.add_stream("pcm_u8", rate=8000)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(
            (samples // 256 + 128).astype(np.uint8).reshape(1, -1), "u8", "mono"
        )
        frame.sample_rate = 8000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return out_file.getvalue()


def test_the_clients_file_name_is_never_used(server, solo):
    """Audio called a playlist, with a path in its name, is audio: the bytes decide, never the name."""
    with httpx.Client(base_url=server, timeout=120) as http:
        for name in ("../../../etc/x.m3u8", "list.ffconcat", "noextension", "x" * 300 + ".flac"):
            answer = _post(http, name, JFK.read_bytes())
            assert answer.status_code == 200, (name, answer.text)
            assert answer.json()["text"] == solo["text"]


def _raw_post(url: str, path: Path) -> socket.socket:
    """Send a whole transcription request on a raw socket and return it unread (closing it hangs up)."""
    request = httpx.Request(
        "POST",
        url + TRANSCRIPTIONS,
        files={"file": (path.name, path.read_bytes(), "audio/flac")},
        data={"model": "whisper-1"},
        headers=auth(),
    )
    body = request.read()
    split = urlsplit(url)
    sock = socket.create_connection((split.hostname, split.port), timeout=30)
    head = [f"POST {TRANSCRIPTIONS} HTTP/1.1", f"Host: {split.netloc}", f"Content-Length: {len(body)}"]
    head += [f"{k}: {v}" for k, v in request.headers.items() if k.lower() not in ("host", "content-length")]
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    return sock


def test_a_full_queue_is_429_before_the_upload_is_decoded(tiny_model, bomb, solo, monkeypatch):
    import whisperkv.serve.routes_audio as routes

    decoded: list[str] = []
    real = routes.open_upload

    def recorded(upload, *args):  # noqa: ANN001, ANN202 - the route's own arguments
        decoded.append(upload.filename)
        return real(upload, *args)

    monkeypatch.setattr(routes, "open_upload", recorded)
    with live_server(_make_app(tiny_model, max_queue=1)) as url:
        busy = _raw_post(url, LONG)  # 3.8 min of speech: holds the one place until it hangs up
        try:
            with httpx.Client(base_url=url, timeout=60) as http:
                _wait_for(lambda: _metric(http, "whisperkv_active_jobs") >= 1, 60, "the first job")
                assert decoded == [LONG.name]
                started = time.monotonic()
                refused = _post(http, "silence.flac", bomb)
                took = time.monotonic() - started
                _assert_error(refused, 429, code="queue_full")
                assert int(refused.headers["Retry-After"]) >= 1
                assert decoded == [LONG.name]  # the refused upload was never decoded
                assert took < 5, took
                print(f"429 answered in {took:.3f} s")
        finally:
            busy.close()  # the client hangs up: its job is cancelled
        with httpx.Client(base_url=url, timeout=120) as http:
            _wait_for(lambda: _metric(http, "whisperkv_active_jobs") == 0, 30, "the cancel")
            _assert_good_answer(http, solo)


def _rss_mb(pid: int, field: str) -> float:
    """VmRSS (now) or VmHWM (the peak so far) of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for process {pid}")


#: how far a served upload may take a real server's peak RSS above its idle RSS: the decode pass holds
#: a minute of samples and three 60 s log-Mel blocks, whatever the audio's length (before issue 41 a
#: 0.66 MB FLAC of silence took a server to 1,928 MB)
RSS_BOUND_MB = 200


def test_a_real_server_refuses_a_bomb_in_bounded_memory(tmp_path, bomb, solo):
    with _server(tmp_path, "--max_audio_s", str(AUDIO_LIMIT_S), "--idle_trim", "0") as (proc, http, output):
        warm = http.post(
            TRANSCRIPTIONS, files={"file": ("jfk.flac", JFK.read_bytes())}, data={"model": "whisper-1"}
        )
        assert warm.status_code == 200 and warm.json()["text"] == solo["text"]
        idle = _rss_mb(proc.pid, "VmRSS")
        before_peak = _rss_mb(proc.pid, "VmHWM")
        refused = http.post(
            TRANSCRIPTIONS, files={"file": ("silence.flac", bomb)}, data={"model": "whisper-1"}
        )
        _assert_error(refused, 413, code="audio_too_long", says="--max_audio_s")
        peak = _rss_mb(proc.pid, "VmHWM")
        print(f"idle RSS {idle:.0f} MB, peak before {before_peak:.0f} MB, peak after the bomb {peak:.0f} MB")
        assert peak - idle < RSS_BOUND_MB, (idle, peak)
        again = http.post(
            TRANSCRIPTIONS, files={"file": ("jfk.flac", JFK.read_bytes())}, data={"model": "whisper-1"}
        )
        assert again.status_code == 200 and again.json()["text"] == solo["text"]
    assert "Traceback" not in output[0], output[0]


@pytest.mark.slow
def test_at_the_default_limit_a_four_hour_bomb_is_413_in_bounded_memory(tmp_path, solo):
    """The default ``--max_audio_s`` (3 hours): 4 hours of silence in 59 KB is refused after a
    decode-only pass; the server's peak RSS stays within the same bound of its idle RSS."""
    bomb = silence_flac(4 * 3600)
    with _server(tmp_path, "--idle_trim", "0") as (proc, http, output):
        warm = http.post(
            TRANSCRIPTIONS, files={"file": ("jfk.flac", JFK.read_bytes())}, data={"model": "whisper-1"}
        )
        assert warm.status_code == 200 and warm.json()["text"] == solo["text"]
        idle = _rss_mb(proc.pid, "VmRSS")
        refused = http.post(
            TRANSCRIPTIONS, files={"file": ("silence.flac", bomb)}, data={"model": "whisper-1"}
        )
        _assert_error(refused, 413, code="audio_too_long", says="limit of 10800 s (--max_audio_s)")
        peak = _rss_mb(proc.pid, "VmHWM")
        print(f"idle RSS {idle:.0f} MB, peak after the 4 h bomb {peak:.0f} MB")
        assert peak - idle < RSS_BOUND_MB, (idle, peak)
    assert "Traceback" not in output[0], output[0]
