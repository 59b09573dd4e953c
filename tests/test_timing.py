"""Word-level timestamps: DTW, median filter and punctuation merging by hand; parity with the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import require_oracle
from whisperkv.timing import (
    WordTiming,
    add_word_timestamps,
    dtw,
    get_end,
    is_segment_anomaly,
    median_filter,
    merge_punctuations,
    next_words_segment,
)
from whisperkv.timing_signal import SORT_7, dtw_numpy

SPEECH_EN = Path(__file__).resolve().parents[1].parent / "shared/data/speech/en"
PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"

# --------------------------------------------------------------------------------- DTW


def test_dtw_follows_the_cheap_cells():
    x = np.array([[0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    rows, cols = dtw(x)
    assert rows.tolist() == [0, 0, 1, 1]
    assert cols.tolist() == [0, 1, 2, 3]


def test_dtw_diagonal():
    x = 1.0 - np.eye(3)
    rows, cols = dtw(x)
    assert rows.tolist() == [0, 1, 2]
    assert cols.tolist() == [0, 1, 2]


def test_dtw_ties_take_the_time_step():
    # All costs equal: at (1, 1) diagonal, vertical and horizontal tie, and the horizontal one wins
    # (traced backwards: the last cell is reached from its left), as in the reference.
    rows, cols = dtw(np.zeros((2, 2)))
    assert rows.tolist() == [0, 1, 1]
    assert cols.tolist() == [0, 0, 1]


@pytest.mark.parametrize("shape", [(1, 1), (1, 6), (6, 1), (7, 11), (12, 40)])
def test_dtw_path_is_monotonic_and_minimal(shape):
    rng = np.random.default_rng(sum(shape))
    x = rng.random(shape)
    rows, cols = dtw(x)
    n, m = shape
    assert (rows[0], cols[0]) == (0, 0) and (rows[-1], cols[-1]) == (n - 1, m - 1)
    steps = np.stack([np.diff(rows), np.diff(cols)], axis=1)
    assert all(tuple(s) in {(1, 0), (0, 1), (1, 1)} for s in steps)
    # Minimal total cost by a plain double loop.
    best = np.full((n + 1, m + 1), np.inf)
    best[0, 0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            best[i, j] = x[i - 1, j - 1] + min(best[i - 1, j - 1], best[i - 1, j], best[i, j - 1])
    assert x[rows, cols].sum() == pytest.approx(best[n, m], rel=1e-5)


def _kernel_path(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from whisperkv.cpu.dtw import path

    found = path(x)
    if found is None:
        pytest.skip("the C kernels are not built here (no compiler): dtw runs its numpy twin")
    return found


@pytest.mark.parametrize("kind", ["normal", "ties", "thin"])
def test_the_c_dtw_takes_the_numpy_twins_path_cell_for_cell(kind):
    """The C fill and backtrace against the twin: random costs, costs of a few integers (three-way ties
    everywhere: the tie rule decides most cells) and one-row / one-column matrices."""
    rng = np.random.default_rng(len(kind))
    for trial in range(60):
        n, m = int(rng.integers(1, 50)), int(rng.integers(1, 400))
        if kind == "thin":
            n, m = (1, m) if trial % 2 else (n, 1)
        x = rng.integers(-2, 3, size=(n, m)).astype(float) if kind == "ties" else rng.normal(size=(n, m))
        rows, cols = _kernel_path(x)
        twin_rows, twin_cols = dtw_numpy(x)
        assert rows.tolist() == twin_rows.tolist() and cols.tolist() == twin_cols.tolist(), (n, m, trial)


def test_the_c_dtw_takes_the_twins_path_on_a_real_alignment():
    """A real word-timing matrix (jfk, tiny.en's alignment heads), as ``find_alignment`` passes it."""
    import whisperkv
    from whisperkv.timing import alignment_matrix

    model = whisperkv.load_model("tiny.en")
    result = model.transcribe(str(SPEECH_EN / "jfk.flac"), without_timestamps=True)
    tokens = [t for s in result["segments"] for t in s["tokens"] if t < model.tokenizer.eot]
    mel = whisperkv.log_mel_spectrogram(whisperkv.pad_or_trim(whisperkv.load_audio(SPEECH_EN / "jfk.flac")))
    mel = mel[None]
    cross_kv = model.decoder.project_cross_kv(model.embed_audio(mel), model.encoder_provenance(mel))
    matrix, _ = alignment_matrix(model, model.tokenizer, tokens, 1100, cross_kv=cross_kv)
    x = -matrix.double().numpy()
    rows, cols = _kernel_path(x)
    twin_rows, twin_cols = dtw_numpy(x)
    assert len(rows) > x.shape[1] - 1
    assert rows.tolist() == twin_rows.tolist() and cols.tolist() == twin_cols.tolist()


def test_a_matrix_the_c_dtw_does_not_take_goes_to_the_twin():
    """Not finite, or large enough to reach the C fill's border sentinel: ``path`` declines, ``dtw``
    gives the twin's path (a NaN cell included)."""
    from whisperkv.cpu.dtw import path

    _kernel_path(np.zeros((2, 2)))  # skips where the kernels are not built
    x = np.random.default_rng(5).normal(size=(6, 9))
    for bad in (np.nan, np.inf, 1e38):
        y = x.copy()
        y[2, 3] = bad
        assert path(y) is None
        rows, cols = dtw(y)
        twin_rows, twin_cols = dtw_numpy(y)
        assert rows.tolist() == twin_rows.tolist() and cols.tolist() == twin_cols.tolist()


def _planted_path(n: int, m: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference suite's ``test_dtw`` matrix: random float32 costs in [0, 1) and a monotonic path of
    cells lowered by 1 (a diagonal step wherever its shuffled steps turn), and that path."""
    rng = np.random.default_rng(seed)
    steps = np.concatenate([np.zeros(n - 1), np.ones(m - 1)])
    rng.shuffle(steps)
    x = rng.random((n, m)).astype(np.float32)
    i = j = k = 0
    cells = [(0, 0)]
    while k < len(steps):
        if k + 1 < len(steps) and steps[k] != steps[k + 1]:
            i, j, k = i + 1, j + 1, k + 2
        else:
            i, j, k = i + int(steps[k] == 0), j + int(steps[k] == 1), k + 1
        cells.append((i, j))
    path = np.array(cells).T
    x[path[0], path[1]] -= 1
    return x, path


@pytest.mark.oracle
def test_dtw_takes_the_references_path_where_float32_costs_would_not():
    """Costs accumulate in float64, as the reference's numba-compiled ``dtw_cpu`` keeps them. With float32
    sums (what its source reads as) this planted path (seed 195; 1 of 300 seeds) came out one cell longer
    than the reference's: the reference suite's own ``test_dtw`` failed once in CI that way."""
    reference = require_oracle("whisper").timing.dtw_cpu
    x, planted = _planted_path(123, 1500, 195)
    expected = reference(x)
    assert expected.tolist() == planted.tolist()
    for rows, cols in (dtw(x), dtw_numpy(x)):
        assert [rows.tolist(), cols.tolist()] == planted.tolist()
    rng = np.random.default_rng(7)
    for shape in [(3, 50), (40, 400), (17, 9)]:  # the shapes word timing passes: tokens x frames
        y = -rng.random(shape)
        rows, cols = dtw(y)
        assert [rows.tolist(), cols.tolist()] == reference(y).tolist(), shape


# --------------------------------------------------------------------------------- median filter


def test_median_filter_reflects_edges():
    x = torch.tensor([1.0, 5.0, 2.0, 8.0, 3.0])
    # reflect-padded: [5, 1, 5, 2, 8, 3, 8] → medians of each run of 3
    assert median_filter(x, 3).tolist() == [5.0, 2.0, 5.0, 3.0, 8.0]
    # width 5, padded [2, 5, 1, 5, 2, 8, 3, 8, 2]
    assert median_filter(x, 5).tolist() == [2.0, 5.0, 3.0, 5.0, 3.0]


def test_median_filter_works_along_the_last_axis_of_any_shape():
    x = torch.tensor([1.0, 5.0, 2.0, 8.0, 3.0])
    stacked = torch.stack([x, -x, 2 * x]).reshape(3, 1, 5).repeat(1, 2, 1)  # [3, 2, 5]
    out = median_filter(stacked, 3)
    assert out.shape == stacked.shape
    expected = torch.tensor([5.0, 2.0, 5.0, 3.0, 8.0])
    assert torch.equal(out[0, 1], expected)
    assert torch.equal(out[1, 0], -expected)  # the median commutes with negation
    assert torch.equal(out[2, 1], 2 * expected)


def test_median_filter_short_input_unchanged_and_even_width_rejected():
    x = torch.tensor([[3.0, 1.0, 2.0]])
    assert torch.equal(median_filter(x, 7), x)  # 3 samples cannot be mirrored by 3
    with pytest.raises(ValueError):
        median_filter(x, 4)


def test_the_seven_input_network_sorts_every_zero_one_input():
    # the 0/1 principle: a comparator network that sorts every 0/1 input sorts every input
    for n in range(2**7):
        lanes = [float((n >> i) & 1) for i in range(7)]
        for layer in SORT_7:
            for i, j in layer:
                lanes[i], lanes[j] = min(lanes[i], lanes[j]), max(lanes[i], lanes[j])
        assert lanes == sorted(lanes), n


def _sorted_middle(x: np.ndarray, width: int) -> np.ndarray:
    """The reference's definition, in NumPy: reflect-padded windows, sorted (NaN last), the middle."""
    half = width // 2
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(half, half)], mode="reflect")
    windows = np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1)
    return np.sort(windows, axis=-1)[..., half]


@pytest.mark.parametrize("shape", [(4, 30, 750), (1, 9), (2, 3, 4)])
def test_median_filter_at_width_7_equals_the_sorted_middle(shape):
    # word timing's width runs through the sorting network: ties (values from a few levels), both
    # signs of zero, and an input with NaN (the sort's path) give the sort's middle
    generator = torch.Generator().manual_seed(7)
    x = torch.randint(-3, 4, shape, generator=generator).float() / 2
    x[..., ::5] *= -1.0  # -0.0 beside 0.0
    assert torch.equal(median_filter(x, 7), torch.from_numpy(_sorted_middle(x.numpy(), 7)))
    y = torch.randn(shape, generator=generator)
    assert torch.equal(median_filter(y, 7), torch.from_numpy(_sorted_middle(y.numpy(), 7)))
    y.view(-1)[1] = float("nan")
    got, expected = median_filter(y, 7), torch.from_numpy(_sorted_middle(y.numpy(), 7))
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got[~got.isnan()], expected[~expected.isnan()])


# --------------------------------------------------------------------------------- punctuation


def _words(*texts: str) -> list[WordTiming]:
    return [WordTiming(t, [i], float(i), float(i) + 0.5, 0.9) for i, t in enumerate(texts)]


def test_merge_punctuations_forward_and_backward():
    alignment = _words(' "', "Hello", ",", " world", ".", '"')
    merge_punctuations(alignment, "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、")
    assert [w.word for w in alignment] == ["", ' "Hello,', "", ' world."', "", ""]
    assert [w.tokens for w in alignment] == [[], [0, 1, 2], [], [3, 4, 5], [], []]
    # times are not touched: the word keeps its own
    assert alignment[1].start == 1.0 and alignment[3].end == 3.5


def test_merge_punctuations_chains_and_leaves_inner_marks():
    alignment = _words(" (", ' "', "quoted", '"', ")", " well", "-", "known")
    merge_punctuations(alignment, "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、")
    assert [w.word for w in alignment] == ["", "", ' ( "quoted")', "", "", " well", "-", "known"]
    assert alignment[2].tokens == [0, 1, 2, 3, 4]


def test_merge_punctuations_keeps_the_words_probability_and_records_its_marks():
    """The reference's ``probability`` stays the word's own tokens'; the lowest of the marks attached
    (before or after it) is kept beside it for a live stream's sureness."""
    alignment = _words(' "', "Hello", ",", " world", ".", '"', " bare")
    for timing, probability in zip(alignment, [0.8, 0.9, 0.4, 0.95, 0.6, 0.7, 0.5], strict=True):
        timing.probability = probability
    merge_punctuations(alignment, "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、")
    merged = [w for w in alignment if w.word]
    assert [w.word for w in merged] == [' "Hello,', ' world."', " bare"]
    assert [w.probability for w in merged] == [0.9, 0.95, 0.5]
    assert [w.marks_probability for w in merged] == [0.4, 0.6, 1.0]


def test_merge_punctuations_needs_a_space_before_opening_marks():
    alignment = _words("a", "(", "b")
    merge_punctuations(alignment, "(", ")")
    assert [w.word for w in alignment] == ["a", "(", "b"]


# --------------------------------------------------------------------------------- transcribe helpers


def test_segment_helpers():
    good = {
        "start": 0.0,
        "end": 2.0,
        "words": [{"word": " yes", "start": 0.0, "end": 0.5, "probability": 0.9}],
    }
    empty = {"start": 2.0, "end": 3.0, "words": []}
    bad = {
        "start": 3.0,
        "end": 3.1,
        "words": [
            {"word": " uh", "start": 3.0, "end": 3.02, "probability": 0.05},
            {"word": ".", "start": 3.02, "end": 3.02, "probability": 0.01},
        ],
    }
    assert get_end([good, empty]) == 0.5
    assert get_end([empty]) == 3.0
    assert get_end([]) is None
    assert next_words_segment([empty, good]) is good
    assert next_words_segment([empty]) is None
    assert not is_segment_anomaly(good, PUNCTUATION)
    assert not is_segment_anomaly(empty, PUNCTUATION)
    assert not is_segment_anomaly(None, PUNCTUATION)
    assert is_segment_anomaly(bad, PUNCTUATION)


# --------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def model():
    import whisperkv

    # One intra-op thread: on a few shared cores, more threads mostly wait for each other.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield whisperkv.load_model("tiny.en")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference(model):
    whisper = require_oracle("whisper")
    ref = whisper.model.Whisper(whisper.model.ModelDimensions(**model.dims.to_dict()))
    ref.load_state_dict(model.state_dict())
    ref.eval()
    mask = torch.zeros(model.dims.n_text_layer, model.dims.n_text_head, dtype=torch.bool)
    for layer, head in model.alignment_heads:
        mask[layer, head] = True
    ref.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)
    return ref


def _clip(name: str) -> np.ndarray:
    import whisperkv

    path = SPEECH_EN / name
    if not path.exists():
        pytest.skip(f"speech clip {path} not available")
    return whisperkv.load_audio(str(path))


def test_only_a_stream_asks_for_each_words_probability_with_its_punctuation(model):
    from whisperkv.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim

    audio = _clip("mfa_surround.flac")[: 30 * 16000]  # one window
    tokens = [s["tokens"] for s in model.transcribe(audio, temperature=0.0)["segments"] if not s["seek"]]
    mel = pad_or_trim(log_mel_spectrogram(audio), N_FRAMES)
    frames = len(audio) // 160

    def words(with_marks: bool) -> list[dict]:
        segments = [{"seek": 0, "start": 0.0, "end": 11.0, "text": "", "tokens": t} for t in tokens]
        add_word_timestamps(
            segments=segments, model=model, tokenizer=model.tokenizer, mel=mel, num_frames=frames,
            last_speech_timestamp=0.0, with_marks=with_marks,
        )  # fmt: skip
        return [w for s in segments for w in s["words"]]

    plain, marked = words(False), words(True)
    assert all(set(w) == {"word", "start", "end", "probability"} for w in plain)  # the reference's shape
    assert [{k: w[k] for k in plain[0]} for w in marked] == plain
    sure = [w["probability_with_marks"] for w in marked]
    assert all(p <= w["probability"] for p, w in zip(sure, marked, strict=True))
    unmarked = [w for w in marked if w["word"].strip().isalpha()]
    assert unmarked and all(w["probability_with_marks"] == w["probability"] for w in unmarked)
    # ' forced,' (0.88, its comma 0.29): a word sure enough for ``--confident 0.5``, its comma not
    assert any(w["probability_with_marks"] < 0.5 <= w["probability"] for w in marked)


def test_words_are_ordered_inside_their_segments_and_reuse_the_window(model):
    result = model.transcribe(_clip("jfk.flac"), word_timestamps=True)
    words = [w for s in result["segments"] for w in s["words"]]
    assert "".join(w["word"] for w in words).strip() == result["text"].strip()
    for segment in result["segments"]:
        for w in segment["words"]:
            assert segment["start"] <= w["start"] <= w["end"] <= segment["end"]
            assert 0.0 <= w["probability"] <= 1.0
    starts = [w["start"] for w in words]
    assert starts == sorted(starts)
    assert "word alignment: encoder output and Cross-KV reused" in result["cache"]["reuse"]["hits"]


def _compare(model, reference, audio: np.ndarray, label: str, **options) -> None:
    ours = model.transcribe(audio, word_timestamps=True, **options)
    ref = reference.transcribe(audio, fp16=False, word_timestamps=True, **options)
    our_words = [w for s in ours["segments"] for w in s["words"]]
    ref_words = [w for s in ref["segments"] for w in s["words"]]
    assert [w["word"] for w in our_words] == [w["word"] for w in ref_words], label
    d_start = np.abs([a["start"] - b["start"] for a, b in zip(our_words, ref_words, strict=True)])
    d_end = np.abs([a["end"] - b["end"] for a, b in zip(our_words, ref_words, strict=True)])
    d_prob = np.abs([a["probability"] - b["probability"] for a, b in zip(our_words, ref_words, strict=True)])
    print(
        f"{label}: {len(our_words)} words, |Δstart| median {np.median(d_start):.3f} max {d_start.max():.3f}, "
        f"|Δend| median {np.median(d_end):.3f} max {d_end.max():.3f}, |Δprob| max {d_prob.max():.1e}"
    )
    assert np.median(d_start) <= 0.05 and np.median(d_end) <= 0.05, label
    assert d_prob.max() < 1e-3, label
    assert len(ours["segments"]) == len(ref["segments"]), label
    for a, b in zip(ours["segments"], ref["segments"], strict=True):
        assert a["start"] == pytest.approx(b["start"], abs=0.05), label
        assert a["end"] == pytest.approx(b["end"], abs=0.05), label


@pytest.mark.oracle
@pytest.mark.parametrize(
    "name",
    [
        "jfk.flac",
        pytest.param("lj_LJ001-0001.flac", marks=pytest.mark.slow),
        pytest.param("lj_LJ001-0004.flac", marks=pytest.mark.slow),
    ],
)
def test_word_timestamps_match_reference(model, reference, name):
    _compare(model, reference, _clip(name), name)


def _all_english_clips() -> list[str]:
    if not SPEECH_EN.is_dir():
        return []
    return sorted(p.name for p in SPEECH_EN.iterdir() if p.suffix in {".wav", ".flac", ".mp3"})


@pytest.mark.slow
@pytest.mark.oracle
@pytest.mark.parametrize("name", _all_english_clips())
def test_word_timestamps_match_reference_all_clips(model, reference, name):
    audio = _clip(name)
    if len(audio) > 30 * 16000:
        pytest.skip("longer than 30 s")
    _compare(model, reference, audio, name)


@pytest.mark.slow
@pytest.mark.oracle
@pytest.mark.parametrize("options", [{}, {"hallucination_silence_threshold": 2.0}])
def test_word_timestamps_match_reference_across_windows(model, reference, options):
    # Two clips back to back, with a second of silence: 53 s, so several windows whose seek follows
    # the last word's end. Greedy only: a window there needs temperature fallback, and sampled text
    # cannot be expected to match the reference's draw for draw.
    options = {**options, "temperature": 0.0}
    silence = np.zeros(16000, dtype=np.float32)
    audio = np.concatenate([_clip("mfa_acoustic_corpus.wav"), silence, _clip("mfa_cold_corpus.wav")])
    _compare(model, reference, audio, f"two clips {options}", **options)
