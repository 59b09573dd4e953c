"""Reading a file window by window gives exactly what decoding it whole gives, in bounded memory."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from whisperkv.audio import N_FRAMES, N_SAMPLES, SAMPLE_RATE, load_audio, log_mel_spectrogram
from whisperkv.audio_source import FileSource, InMemorySource, open_source
from whisperkv.batched import chunk_mel, split_at_silences, transcribe_batched
from whisperkv.errors import AudioError

SPEECH_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "speech"
LONG_FILES = ["long/lj001_0001-0032_concat.flac", "long/librivox_sonnets_001-003_concat.flac"]
FILE_RATE = 22050  # the long test file is written at another rate, so every read goes through the resampler
MAX_BUFFERED = 4 * 60 * SAMPLE_RATE  # what a file source may hold decoded at once: well under 4 minutes


def _write_wav(path: Path, rate: int, samples: np.ndarray) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1 if samples.ndim == 1 else samples.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return path


@pytest.fixture(scope="module")
def long_file(tmp_path_factory) -> tuple[Path, np.ndarray, torch.Tensor]:
    """6.5 min of speech (the two long-form files) as one 22.05 kHz WAV, its waveform and log-Mel as the
    in-memory path computes them. Seven 60 s log-Mel blocks: as many block boundaries as any length."""
    if not all((SPEECH_DIR / f).is_file() for f in LONG_FILES):
        pytest.skip("long-form speech files not found")
    parts = [load_audio(SPEECH_DIR / f, sr=FILE_RATE) for f in LONG_FILES]
    pcm = np.round(np.concatenate(parts) * 32767).astype(np.int16)
    path = _write_wav(tmp_path_factory.mktemp("long") / "six_minutes.wav", FILE_RATE, pcm)
    waveform = load_audio(path)
    assert len(waveform) > 6 * 60 * SAMPLE_RATE
    return path, waveform, log_mel_spectrogram(waveform, 80, padding=N_SAMPLES)


def _check_bounded(source: FileSource) -> None:
    assert len(source._stream.buffer) <= MAX_BUFFERED
    assert len(source._blocks) <= 3


def test_every_window_and_random_windows_of_a_long_file_are_bit_identical(long_file) -> None:
    path, waveform, log_mel = long_file
    source = open_source(path, 80)
    assert isinstance(source, FileSource)
    assert source.n_samples == len(waveform)
    assert source.content_frames == len(waveform) // 160
    # as the loop reads: the language-detection window, then 30 s windows, each overlapping the last
    assert torch.equal(source.mel(0, N_FRAMES), log_mel[:, :N_FRAMES])
    seek = 0
    while seek < source.content_frames:
        size = min(N_FRAMES, source.content_frames - seek)
        got = source.samples(seek * 160, (seek + size) * 160)
        assert torch.equal(got, torch.from_numpy(waveform[seek * 160 : (seek + size) * 160])), seek
        assert torch.equal(source.mel(seek, seek + size), log_mel[:, seek : seek + size]), seek
        _check_bounded(source)
        seek += size - 250 if size == N_FRAMES else size  # the next window starts inside this one
    # the padding after the audio, as the last window sees it
    end = source.content_frames
    assert torch.equal(source.mel(end - 100, end + N_FRAMES), log_mel[:, end - 100 : end + N_FRAMES])
    assert source.rewinds == 0  # read forward once: no window decoded twice

    # then random windows, mostly forward, with the jumps back a caller can make: a little, and to the
    # start, which decodes again from the start (once), giving the same bits
    rng = np.random.default_rng(7)
    starts = np.sort(rng.integers(0, log_mel.shape[1], 24))
    requests = [(int(a), int(a + rng.integers(1, 4000))) for a in starts]
    requests[12:12] = [(int(starts[11]) - 500, int(starts[11]) + 2500), (0, N_FRAMES)]
    for start, stop in requests:
        assert torch.equal(source.mel(start, stop), log_mel[:, start:stop]), (start, stop)
        got = source.samples(start * 160, stop * 160)
        assert torch.equal(got, torch.from_numpy(waveform[start * 160 : stop * 160])), (start, stop)
        _check_bounded(source)
    assert 2 <= source.rewinds <= 3  # back to the first random window, to the start, back again
    assert source.decodes == 1  # the first pass; the windows and every rewind read its spool


def test_a_file_longer_than_the_spool_is_decoded_again_with_the_same_bits(long_file) -> None:
    """Past ``spool_bytes`` the spool is dropped and the windows come from a second decode (and each
    rewind from another): the same frames and samples as the in-memory path."""
    path, waveform, log_mel = long_file
    source = FileSource(path, 80, spool_bytes=2 * 60 * SAMPLE_RATE * 2)  # 2 min of 6.5
    assert source.n_samples == len(waveform) and source.decodes == 2  # the scan, then the windows'
    for start, stop in [(0, N_FRAMES), (20_000, 20_000 + N_FRAMES), (100, 2100)]:  # the last one rewinds
        assert torch.equal(source.mel(start, stop), log_mel[:, start:stop]), start
        assert torch.equal(
            source.samples(start * 160, stop * 160), torch.from_numpy(waveform[start * 160 : stop * 160])
        )
    assert source.rewinds == 1 and source.decodes == 3


def test_transcribe_reads_a_long_file_through_the_file_source(tiny_model, long_file) -> None:
    """The loop itself, on one clipped window deep into the file: the same segments as from the waveform
    (the window's frames are clipped against the whole file's maximum, so this needs the first pass)."""
    path, waveform, _ = long_file
    from_file = tiny_model.transcribe(path, clip_timestamps="200,212")
    from_array = tiny_model.transcribe(waveform, clip_timestamps="200,212")
    assert from_file["segments"] == from_array["segments"]
    assert len(from_file["text"].split()) > 10


@pytest.mark.parametrize("n_samples", [80, 12345, N_SAMPLES, N_SAMPLES + 160])
def test_short_and_block_boundary_lengths(tmp_path: Path, n_samples: int) -> None:
    """Shorter than the STFT's reflection (80), a length off the hop (12345), frames ending exactly at a
    60 s block (480000: 6000 frames with the padding), and one frame into the next block (480160)."""
    noise = np.random.default_rng(n_samples).integers(-8000, 8000, n_samples).astype(np.int16)
    path = _write_wav(tmp_path / "noise.wav", SAMPLE_RATE, noise)
    waveform = load_audio(path)
    log_mel = log_mel_spectrogram(waveform, 80, padding=N_SAMPLES)
    source = FileSource(path, 80)
    assert source.n_samples == n_samples
    assert torch.equal(source.mel(0, log_mel.shape[1] + 10), log_mel)
    assert torch.equal(source.samples(0, n_samples + 10), torch.from_numpy(waveform))


def test_a_resampled_mp3_is_bit_identical() -> None:
    path = SPEECH_DIR / "en" / "common_voice_en_22058264.mp3"  # 48 kHz MP3
    if not path.is_file():
        pytest.skip("speech set not found")
    assert isinstance(open_source(path, 80), InMemorySource)  # a 4 s file is read whole
    source = FileSource(path, 80)
    reference = InMemorySource(load_audio(path), 80)
    assert source.n_samples == reference.n_samples
    assert torch.equal(source.mel(0, 2 * N_FRAMES), reference.mel(0, 2 * N_FRAMES))
    assert torch.equal(source.samples(0, source.n_samples), reference.samples(0, source.n_samples))


def test_a_file_changed_between_passes_is_refused(tmp_path: Path) -> None:
    """Decoded twice (no spool), a file changed in between is refused; read from its spool, the windows
    are the file as the first pass decoded it, whatever happens to the file after."""
    one_second = np.full(SAMPLE_RATE, 1000, dtype=np.int16)
    path = _write_wav(tmp_path / "a.wav", SAMPLE_RATE, one_second)
    expected = log_mel_spectrogram(load_audio(path), 80, padding=N_SAMPLES)[:, :100]
    twice, once = FileSource(path, 80, spool_bytes=0), FileSource(path, 80)
    assert twice.content_frames == once.content_frames == 100  # first passes done
    _write_wav(path, SAMPLE_RATE, np.full(2 * SAMPLE_RATE, 3000, dtype=np.int16))
    with pytest.raises(AudioError, match="changed while it was being read"):
        twice.mel(0, 100)
    assert torch.equal(once.mel(0, 100), expected) and once.decodes == 1


def test_bad_files_fail_when_opened_or_first_read(tmp_path: Path) -> None:
    with pytest.raises(AudioError, match="file not found"):
        open_source(tmp_path / "missing.wav", 80)
    text = tmp_path / "notes.wav"
    text.write_text("not audio\n" * 50)
    with pytest.raises(AudioError, match="not an audio file"):
        open_source(text, 80).content_frames  # noqa: B018 - reading the length is the first pass


def test_batched_reads_the_same_chunks_and_windows_from_a_file(long_file) -> None:
    """The batched mode's detector and chunk windows read through the source give the same numbers as
    from the whole waveform, so its transcript is the same (the slow test below runs the model)."""
    path, waveform, _ = long_file
    source = FileSource(path, 80)
    chunks = split_at_silences(source)
    assert chunks == split_at_silences(waveform)
    assert len(chunks) >= 10
    for chunk in chunks[:: max(1, len(chunks) // 8)]:
        assert torch.equal(chunk_mel(source, chunk, 80), chunk_mel(waveform, chunk, 80))
        _check_bounded(source)
    assert source._peak is None  # the batched mode never needs the whole file's log-Mel


@pytest.mark.slow
@pytest.mark.parametrize("name", LONG_FILES)
def test_batched_transcript_from_a_file_equals_from_its_waveform(tiny_model, name: str) -> None:
    path = SPEECH_DIR / name
    if not path.is_file():
        pytest.skip("long-form speech files not found")
    from_file = transcribe_batched(tiny_model, path)
    from_array = transcribe_batched(tiny_model, load_audio(path))
    assert from_file["segments"] == from_array["segments"]


@pytest.mark.slow
def test_sequential_transcript_from_a_file_equals_from_its_waveform(tiny_model) -> None:
    path = SPEECH_DIR / LONG_FILES[1]
    if not path.is_file():
        pytest.skip("long-form speech files not found")
    from_file = tiny_model.transcribe(path)
    from_array = tiny_model.transcribe(load_audio(path))
    assert from_file["segments"] == from_array["segments"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_arrays_are_refused_before_any_work(tiny_model, bad: float) -> None:
    """NaN/inf would reach the sampler as NaN probabilities; the error names where the first one is."""
    audio = np.zeros(3 * SAMPLE_RATE, dtype=np.float32)
    audio[24000] = bad
    expected = rf"<array>: non-finite sample \({bad}\) at sample 24000 \(1\.500 s\)"
    with pytest.raises(AudioError, match=expected):
        tiny_model.transcribe(audio)
    with pytest.raises(AudioError, match=expected):
        tiny_model.transcribe(torch.from_numpy(audio))
    with pytest.raises(AudioError, match=expected):
        transcribe_batched(tiny_model, audio)
