"""Tests for whisperkv.audio: the Mel filterbank, the log-Mel spectrogram and pad_or_trim, against the
reference's table and spectrogram on the speech set's clips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import require_oracle
from tests.test_audio import SPEECH_DIR, _clip
from whisperkv.audio import (
    HOP_LENGTH,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    load_audio,
    log_mel_spectrogram,
    mel_filters,
    pad_or_trim,
)

# --- 1. Mel filterbank ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n_mels", [80, 128])
def test_mel_filters_match_reference_table(n_mels: int) -> None:
    whisper = require_oracle("whisper")
    table = np.load(Path(whisper.__file__).parent / "assets" / "mel_filters.npz")[f"mel_{n_mels}"]
    filters = mel_filters(n_mels)
    assert filters.shape == (n_mels, 201) and filters.dtype == torch.float32
    assert np.abs(filters.numpy() - table).max() <= 1e-6
    assert mel_filters(n_mels) is filters  # cached


def test_mel_filters_rejects_other_sizes() -> None:
    with pytest.raises(ValueError):
        mel_filters(64)


# --- 2. log-Mel spectrogram -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clips() -> dict[str, np.ndarray]:
    return {suffix: load_audio(SPEECH_DIR / _clip(suffix)["file"]) for suffix in (".wav", ".flac", ".mp3")}


@pytest.mark.oracle
@pytest.mark.parametrize("suffix", [".wav", ".flac", ".mp3"])
@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("padding", [0, N_SAMPLES])
def test_log_mel_matches_reference(
    clips: dict[str, np.ndarray], suffix: str, n_mels: int, padding: int
) -> None:
    whisper_audio = require_oracle("whisper.audio")
    waveform = clips[suffix]
    ours = log_mel_spectrogram(waveform, n_mels, padding=padding)
    theirs = whisper_audio.log_mel_spectrogram(torch.from_numpy(waveform), n_mels, padding=padding)
    assert ours.shape == theirs.shape == (n_mels, (len(waveform) + padding) // HOP_LENGTH)
    assert ours.dtype == torch.float32
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_log_mel_properties(clips: dict[str, np.ndarray]) -> None:
    waveform = clips[".flac"]
    spec = log_mel_spectrogram(torch.from_numpy(waveform), 80)
    assert spec.shape == (80, len(waveform) // HOP_LENGTH)
    assert torch.isfinite(spec).all()
    # The 8.0 (log10) dynamic-range floor, rescaled by 1/4, bounds the spread to exactly 2.
    assert (spec.max() - spec.min()).item() == pytest.approx(2.0)
    # A path gives the same spectrogram as the decoded waveform.
    from_path = log_mel_spectrogram(str(SPEECH_DIR / _clip(".flac")["file"]), 80)
    assert torch.equal(from_path, spec)


# --- 3. pad_or_trim and silence -------------------------------------------------------------------------


def test_pad_or_trim_numpy() -> None:
    x = np.arange(1, 11, dtype=np.float32)
    padded = pad_or_trim(x, 15)
    assert padded.shape == (15,) and padded.dtype == np.float32
    np.testing.assert_array_equal(padded, np.concatenate([x, np.zeros(5, np.float32)]))
    np.testing.assert_array_equal(pad_or_trim(x, 4), x[:4])
    assert pad_or_trim(x, 10) is x

    grid = np.arange(12).reshape(3, 4)
    assert pad_or_trim(grid, 5, axis=0).shape == (5, 4)
    np.testing.assert_array_equal(pad_or_trim(grid, 5, axis=0)[3:], 0)
    np.testing.assert_array_equal(pad_or_trim(grid, 2, axis=-1), grid[:, :2])


def test_pad_or_trim_torch() -> None:
    x = torch.arange(1, 11, dtype=torch.float32)
    padded = pad_or_trim(x, 15)
    assert padded.shape == (15,) and padded.dtype == torch.float32
    assert torch.equal(padded, torch.cat([x, torch.zeros(5)]))
    assert torch.equal(pad_or_trim(x, 4), x[:4])

    grid = torch.arange(12).reshape(3, 4)
    assert torch.equal(pad_or_trim(grid, 5, axis=0)[:3], grid)
    assert torch.equal(pad_or_trim(grid, 5, axis=0)[3:], torch.zeros(2, 4, dtype=grid.dtype))
    assert torch.equal(pad_or_trim(grid, 6, axis=1)[:, 4:], torch.zeros(3, 2, dtype=grid.dtype))
    assert torch.equal(pad_or_trim(grid, 2, axis=-1), grid[:, :2])

    mel = torch.randn(80, 1234)
    assert pad_or_trim(mel, N_FRAMES).shape == (80, N_FRAMES)


def test_silence_gives_finite_spectrogram() -> None:
    spec = log_mel_spectrogram(np.zeros(SAMPLE_RATE, dtype=np.float32), padding=N_SAMPLES)
    assert spec.shape == (80, (SAMPLE_RATE + N_SAMPLES) // HOP_LENGTH)
    assert torch.isfinite(spec).all()
    # Every bin sits at the 1e-10 floor: log10 = -10, then (-10 + 4) / 4.
    assert torch.all(spec == -1.5)
