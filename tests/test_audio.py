"""Tests for whisperkv.audio: decoding and error handling (real clips, synthesised formats, rates and
channel counts, bad and truncated files, non-finite float samples, MP3 length headers).

The Mel filterbank, the log-Mel spectrogram and ``pad_or_trim`` are tests/test_audio_mel.py's.
"""

from __future__ import annotations

import csv
import struct
import wave
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from whisperkv.audio import SAMPLE_RATE, audio_duration, load_audio
from whisperkv.errors import AudioError

SPEECH_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "speech"
TONE_HZ = 440.0
# Left and right carry the same tone at different levels; a correct downmix averages them.
LEFT_AMPLITUDE, RIGHT_AMPLITUDE = 0.6, 0.2
MONO_RMS = (LEFT_AMPLITUDE + RIGHT_AMPLITUDE) / 2 / np.sqrt(2)


# --- helpers --------------------------------------------------------------------------------------------


def _manifest() -> list[dict[str, str]]:
    path = SPEECH_DIR / "manifest.tsv"
    if not path.is_file():
        pytest.skip(f"speech set not found at {SPEECH_DIR}")
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def _clip(suffix: str) -> dict[str, str]:
    """The first short (< 6 s) manifest clip with the given file suffix."""
    rows = [r for r in _manifest() if r["file"].endswith(suffix) and float(r["duration_s"]) < 6]
    if not rows:
        pytest.skip(f"no {suffix} clip in the speech set")
    return rows[0]


def _stereo_tone(rate: int, seconds: float) -> np.ndarray:
    """A TONE_HZ sine, louder on the left than on the right, as int16 of shape [n, 2]."""
    t = np.arange(int(rate * seconds)) / rate
    tone = np.sin(2 * np.pi * TONE_HZ * t)
    stereo = np.stack([LEFT_AMPLITUDE * tone, RIGHT_AMPLITUDE * tone], axis=1)
    return np.round(stereo * 32767).astype(np.int16)


def _write_wav(path: Path, rate: int, samples: np.ndarray) -> Path:
    """Write int16 samples of shape [n, channels] with the stdlib wave module."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return path


def _encode_with_pyav(
    path: Path, container_format: str, codec: str, source_rate: int, codec_rate: int
) -> None:
    """Encode a 3 s stereo tone sampled at ``source_rate`` with ``codec`` running at ``codec_rate``.

    PyAV's encoder converts sample format, rate and frame size itself, so s16 frames of any size do.
    """
    samples = _stereo_tone(source_rate, 3.0)
    with av.open(str(path), "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=codec_rate, layout="stereo")
        for start in range(0, len(samples), 1024):
            block = samples[start : start + 1024]
            frame = av.AudioFrame.from_ndarray(block.reshape(1, -1), format="s16", layout="stereo")
            frame.sample_rate = source_rate
            frame.pts = start
            frame.time_base = Fraction(1, source_rate)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


def _peak_hz(waveform: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(waveform * np.hanning(len(waveform))))
    return float(np.fft.rfftfreq(len(waveform), 1 / SAMPLE_RATE)[np.argmax(spectrum)])


def _rms(waveform: np.ndarray) -> float:
    middle = waveform[len(waveform) // 4 : -len(waveform) // 4]  # skip codec start-up and tail
    return float(np.sqrt(np.mean(middle.astype(np.float64) ** 2)))


# --- 1. real clips --------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".wav", ".flac", ".mp3"])
def test_load_real_clip(suffix: str) -> None:
    row = _clip(suffix)
    waveform = load_audio(SPEECH_DIR / row["file"])
    assert waveform.dtype == np.float32
    assert waveform.ndim == 1
    assert abs(len(waveform) / SAMPLE_RATE - float(row["duration_s"])) < 0.05
    assert audio_duration(waveform) == len(waveform) / SAMPLE_RATE
    assert waveform.min() >= -1.0 and waveform.max() < 1.0
    assert np.abs(waveform).max() > 0.01  # speech, not silence
    # Samples are int16 / 32768, as from `ffmpeg -f s16le`.
    np.testing.assert_array_equal(waveform * 32768.0, np.round(waveform * 32768.0))


def test_load_at_another_rate() -> None:
    row = _clip(".flac")
    waveform = load_audio(str(SPEECH_DIR / row["file"]), sr=8000)
    assert abs(len(waveform) / 8000 - float(row["duration_s"])) < 0.05


# --- 2. formats the speech set lacks, other rates and channel counts ------------------------------------


@pytest.mark.parametrize(
    ("suffix", "container_format", "codec", "source_rate", "codec_rate"),
    [
        (".ogg", "ogg", "libopus", 44100, 48000),  # Opus only runs at 8/12/16/24/48 kHz
        (".m4a", "mp4", "aac", 44100, 44100),
        (".mp3", "mp3", "libmp3lame", 22050, 22050),
        (".flac", "flac", "flac", 96000, 96000),
    ],
)
def test_load_synthesised_formats(
    tmp_path: Path, suffix: str, container_format: str, codec: str, source_rate: int, codec_rate: int
) -> None:
    path = tmp_path / f"tone{suffix}"
    _encode_with_pyav(path, container_format, codec, source_rate, codec_rate)
    with av.open(str(path)) as container:  # the file really is what the test claims
        stream = container.streams.audio[0]
        assert (stream.codec_context.sample_rate, stream.codec_context.channels) == (codec_rate, 2)

    waveform = load_audio(path)
    assert waveform.dtype == np.float32 and waveform.ndim == 1
    assert abs(len(waveform) / SAMPLE_RATE - 3.0) < 0.05
    assert abs(_peak_hz(waveform) - TONE_HZ) < 2.0
    assert _rms(waveform) == pytest.approx(MONO_RMS, rel=0.1)


# --- 3. wav at other rates and channel counts (stdlib wave) ---------------------------------------------


@pytest.mark.parametrize(("rate", "channels"), [(8000, 1), (8000, 2), (48000, 2), (44100, 6)])
def test_load_wav_rates_and_channels(tmp_path: Path, rate: int, channels: int) -> None:
    stereo = _stereo_tone(rate, 2.0)
    if channels == 2:
        samples, expected_rms = stereo, MONO_RMS
    else:
        # Beyond stereo FFmpeg weights channels by their role (5.1: centre 1, surrounds 0.707, LFE 0) and
        # normalises; the same signal on every channel must come through at its own level.
        samples, expected_rms = np.repeat(stereo[:, :1], channels, axis=1), LEFT_AMPLITUDE / np.sqrt(2)
    waveform = load_audio(_write_wav(tmp_path / "tone.wav", rate, samples))
    assert abs(len(waveform) - 2 * SAMPLE_RATE) <= 2
    assert abs(_peak_hz(waveform) - TONE_HZ) < 1.0
    assert _rms(waveform) == pytest.approx(expected_rms, rel=0.02)


def test_16khz_mono_wav_is_bit_exact(tmp_path: Path) -> None:
    samples = np.random.default_rng(0).integers(-32768, 32768, size=(12345, 1), dtype=np.int16)
    samples[:2, 0] = [-32768, 32767]  # both extremes of int16
    waveform = load_audio(_write_wav(tmp_path / "noise.wav", SAMPLE_RATE, samples))
    np.testing.assert_array_equal(waveform, samples[:, 0] / np.float32(32768.0))
    assert waveform.min() == -1.0 and waveform.max() < 1.0


def test_streamed_wav_with_placeholder_size_is_not_truncated(tmp_path: Path) -> None:
    """A WAV written to a pipe says its data size is 0xFFFFFFFF. FFmpeg flags the last packet as short,
    but nothing is missing, so this must decode in full."""
    path = _write_wav(tmp_path / "streamed.wav", 8000, _stereo_tone(8000, 1.0))
    data = bytearray(path.read_bytes())
    size_at = data.index(b"data") + 4
    data[size_at : size_at + 4] = struct.pack("<I", 0xFFFFFFFF)
    path.write_bytes(bytes(data))
    assert abs(len(load_audio(path)) - SAMPLE_RATE) <= 2


# --- 4. bad input ---------------------------------------------------------------------------------------


def _assert_audio_error(path: Path, reason: str) -> None:
    with pytest.raises(AudioError) as caught:
        load_audio(path)
    assert caught.value.source == str(path)
    assert str(path) in str(caught.value)
    assert reason in caught.value.reason


def test_missing_file(tmp_path: Path) -> None:
    _assert_audio_error(tmp_path / "nope.wav", "file not found")


def test_directory(tmp_path: Path) -> None:
    _assert_audio_error(tmp_path, "directory")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.wav"
    path.write_bytes(b"")
    _assert_audio_error(path, "empty file")


def test_text_file_named_wav(tmp_path: Path) -> None:
    path = tmp_path / "notes.wav"
    path.write_text("these are meeting notes, not a recording\n" * 20)
    _assert_audio_error(path, "not an audio file (")


def test_file_without_audio_stream(tmp_path: Path) -> None:
    path = tmp_path / "captions.srt"  # FFmpeg opens subtitles fine: one subtitle stream, no audio
    path.write_text("1\n00:00:01,000 --> 00:00:02,000\nHello\n\n2\n00:00:03,000 --> 00:00:04,000\nWorld\n")
    _assert_audio_error(path, "no audio stream")


def test_zero_length_wav(tmp_path: Path) -> None:
    path = _write_wav(tmp_path / "silent.wav", SAMPLE_RATE, np.zeros((0, 1), dtype=np.int16))
    assert path.stat().st_size == 44  # a complete, valid header
    _assert_audio_error(path, "no audio samples")


def test_flac_truncated_to_half(tmp_path: Path) -> None:
    data = (SPEECH_DIR / _clip(".flac")["file"]).read_bytes()
    path = tmp_path / "half.flac"
    path.write_bytes(data[: len(data) // 2])
    # FFmpeg's FLAC decoder fails on the cut frame ("invalid residual") after decoding the frames before it.
    _assert_audio_error(path, "truncated or corrupt audio")


def test_flac_truncated_at_frame_boundary(tmp_path: Path) -> None:
    """Cut exactly between frames, every remaining frame decodes cleanly; STREAMINFO's count catches it."""
    source = SPEECH_DIR / _clip(".flac")["file"]
    with av.open(str(source)) as container:
        frame_offsets = [p.pos for p in container.demux(audio=0) if p.pos is not None]
    assert len(frame_offsets) > 4
    path = tmp_path / "cut.flac"
    path.write_bytes(source.read_bytes()[: frame_offsets[len(frame_offsets) // 2]])
    _assert_audio_error(path, "truncated or corrupt audio")


def test_wav_truncated_to_half(tmp_path: Path) -> None:
    """The PCM before the cut is intact, so this only shows up as a short read against the header's size."""
    data = _write_wav(tmp_path / "full.wav", 22050, _stereo_tone(22050, 1.0)).read_bytes()
    path = tmp_path / "half.wav"
    path.write_bytes(data[: len(data) // 2])
    _assert_audio_error(path, "truncated or corrupt audio")


def test_mp3_truncated_inside_its_header(tmp_path: Path) -> None:
    # A cut inside the leading tag is caught by FFmpeg. (A cut after the first frames raises nothing; only a
    # Xing/Info/VBRI frame count can show it, see the tests at the end.)
    data = (SPEECH_DIR / _clip(".mp3")["file"]).read_bytes()
    path = tmp_path / "cut.mp3"
    path.write_bytes(data[:100])
    _assert_audio_error(path, "")


# --- 5. non-finite float samples, MP3 length headers -----------------------------------------------------


def _write_float_wav(path: Path, samples: np.ndarray, rate: int = SAMPLE_RATE) -> Path:
    """A 32-bit float WAV of samples shaped [n, channels] (interleaved), written by PyAV."""
    layout = {1: "mono", 2: "stereo"}[samples.shape[1]]
    with av.open(str(path), "w", format="wav") as container:
        stream = container.add_stream("pcm_f32le", rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(
            samples.astype(np.float32).reshape(1, -1), format="flt", layout=layout
        )
        frame.sample_rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return path


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_float_wav_with_non_finite_sample_is_refused(tmp_path: Path, bad: float) -> None:
    """FFmpeg's conversion to int16 would turn these into full-scale samples without a word."""
    samples = np.stack([np.full(20000, 0.1), np.full(20000, -0.1)], axis=1)
    samples[12345, 1] = bad  # right channel only
    path = _write_float_wav(tmp_path / "bad.wav", samples)
    _assert_audio_error(path, "non-finite sample (NaN or infinity) at 0.772 s (sample 12345 of the 16000 Hz")


def test_float_wav_with_finite_samples_loads(tmp_path: Path) -> None:
    tone = _stereo_tone(SAMPLE_RATE, 1.0)[:, :1] / 32768.0
    waveform = load_audio(_write_float_wav(tmp_path / "tone.wav", tone))
    np.testing.assert_allclose(waveform, tone[:, 0], atol=1 / 32768)


def test_cli_reports_a_non_finite_file_in_one_line(tmp_path: Path, capsys) -> None:
    from whisperkv.cli import main

    samples = np.zeros((8000, 1))
    samples[4000, 0] = np.nan
    bad = _write_float_wav(tmp_path / "nan.wav", samples)
    assert main(["transcribe", str(bad), "-o", str(tmp_path / "out"), "-f", "txt"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0] and "non-finite sample" in err[0], err
    assert not (tmp_path / "out" / "nan.txt").exists()


def _lame_mp3(path: Path, rate: int, layout: str) -> Path:
    """The shared 4 s speech clip re-encoded by libmp3lame, which writes an Info (Xing) frame."""
    speech = np.round(load_audio(SPEECH_DIR / _clip(".mp3")["file"]) * 32767).astype(np.int16)
    channels = np.repeat(speech[:, None], 2 if layout == "stereo" else 1, axis=1)
    with av.open(str(path), "w", format="mp3") as container:
        stream = container.add_stream("libmp3lame", rate=rate, layout=layout)
        frame = av.AudioFrame.from_ndarray(channels.reshape(1, -1), format="s16", layout=layout)
        frame.sample_rate, frame.pts, frame.time_base = SAMPLE_RATE, 0, Fraction(1, SAMPLE_RATE)
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return path


@pytest.mark.parametrize(("rate", "layout"), [(44100, "stereo"), (16000, "mono")])  # MPEG-1 and MPEG-2
def test_mp3_truncated_at_half_is_refused_by_its_xing_frame_count(
    tmp_path: Path, rate: int, layout: str
) -> None:
    whole = _lame_mp3(tmp_path / "whole.mp3", rate, layout)
    assert b"Info" in whole.read_bytes()[:2000]  # the frame count this check reads
    assert abs(len(load_audio(whole)) / SAMPLE_RATE - 4.1) < 0.1  # complete: no false alarm
    data = whole.read_bytes()
    cut = tmp_path / "half.mp3"
    cut.write_bytes(data[: len(data) // 2])
    _assert_audio_error(cut, "truncated or corrupt audio (expected 4.")
    with pytest.raises(AudioError, match=r"from its Xing/VBRI header, decoded [12]\.\d+ s\)"):
        load_audio(cut)


def test_mp3_without_a_length_frame_cut_in_half_is_not_detectable(tmp_path: Path) -> None:
    """The known gap, pinned so the README stays true: a CBR MP3 with no Xing/Info/VBRI frame has no
    length to compare with, so its first half decodes as if it were the whole file."""
    source = SPEECH_DIR / _clip(".mp3")["file"]
    data = source.read_bytes()
    assert b"Xing" not in data and b"Info" not in data and b"VBRI" not in data
    cut = tmp_path / "half.mp3"
    cut.write_bytes(data[: len(data) // 2])
    assert len(load_audio(cut)) < 0.6 * len(load_audio(source))
