"""A greedy step's filters and token choice in one pass (decoding/greedy_choice.py, kernels/greedy_choice.c)
against its twin, the filters then ``GreedySearch.update`` through PyTorch: the same tokens always (near
ties of the timestamp rule go to the twin), log-probabilities within 1e-6 of float64's; the kernel's
numbers against NumPy's in float64, in its AVX-512 build and its plain-C one; whole transcripts with and
without it."""

from __future__ import annotations

import ctypes
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from whisperkv.cpu.build import SOURCES, compile_library
from whisperkv.decoding import greedy_choice as greedy_choice_module
from whisperkv.decoding.greedy_choice import GreedyChoice, choose_next
from whisperkv.decoding.logit_filters import SuppressBlank, SuppressTokens, TimestampRules
from whisperkv.decoding.search import BeamSearch, GreedySearch

from .conftest import require_oracle, speech_audio

COMPILER = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C compiler to build the kernel")
SOURCE = next(s for s in SOURCES if s.name == "greedy_choice.c")

N_VOCAB, TS, EOT, NO_TS, BEGIN = 51_864, 50_363, 50_256, 50_362, 3
NEG_INF = float("-inf")


def _filters() -> list:
    return [
        SuppressBlank([220, EOT], BEGIN),
        SuppressTokens([1, 2, 7, 8, 9, 50, 51, 50_257, 50_358, 50_359, 50_360, 50_361, NO_TS]),
        TimestampRules(TS, EOT, NO_TS, BEGIN, 50),
    ]


def _history(g: torch.Generator, kind: int) -> list[int]:
    """Sampled tokens of every shape the timestamp rules read: none, text only, a pair just closed, a
    single stamp after text, stamps late in the window, end of text."""
    stamp = TS + int(torch.randint(0, 1400, (1,), generator=g))
    text = [int(t) for t in torch.randint(100, 20_000, (5,), generator=g)]
    return [
        [],
        [TS] + text,
        [TS] + text + [stamp, stamp],
        [TS] + text + [stamp],
        [TS, TS + 1490] + text[:1] + [TS + 1495],
        [TS] + text + [EOT],
        [TS + 7],
    ][kind % 7]


def _rows(count: int = 140) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(logits [1, V], tokens [1, T]): text-heavy, timestamp-heavy and in between, ties, -inf blocks."""
    g = torch.Generator().manual_seed(11)
    cases = []
    for trial in range(count):
        x = torch.randn(1, N_VOCAB, generator=g) * 3
        x[0, TS:] += float(torch.randn(1, generator=g) * 4)  # the timestamps' weight against the text's
        if trial % 5 == 0:
            x = (x * 2).round() / 2  # equal logits: the first id holding the largest must win
        if trial % 9 == 0:
            x[0, :TS] = NEG_INF
        if trial % 13 == 0:
            x[0, TS:] = NEG_INF
        tokens = torch.tensor([[50_257, 50_362, 50_363][:BEGIN] + _history(g, trial)])
        cases.append((x, tokens))
    return cases


def _float64_logprob(filtered: torch.Tensor, token: int) -> float:
    return float(torch.log_softmax(filtered.double(), dim=-1)[0, token])


def test_the_fused_step_chooses_the_twins_tokens_with_accurate_log_probabilities():
    choice = GreedyChoice.for_window(GreedySearch(0.0, EOT), _filters())
    assert choice is not None, "a compiler is here, so the kernel must be built"
    forced = text = 0
    for x, tokens in _rows():
        twin_logits, twin_sum = x.clone(), torch.zeros(1)
        twin_tokens, twin_done, _ = choose_next(
            None, _filters(), GreedySearch(0.0, EOT), tokens, twin_logits, twin_sum
        )
        fused_logits, fused_sum = x.clone(), torch.zeros(1)
        fused_tokens, fused_done, _ = choice.update(tokens, fused_logits, fused_sum)
        assert torch.equal(fused_tokens, twin_tokens) and fused_done == twin_done
        token = int(fused_tokens[0, -1])
        if bool(torch.isinf(twin_logits).all()):  # nothing allowed: both go PyTorch's way (NaN)
            assert math.isnan(float(fused_sum[0])) and math.isnan(float(twin_sum[0]))
            continue
        if int(tokens[0, -1]) == EOT:  # a finished row adds nothing
            assert float(fused_sum[0]) == float(twin_sum[0]) == 0.0
            continue
        # the twin's logits carry every filter's -inf (and the forced timestamp's): their log-softmax
        assert abs(float(fused_sum[0]) - _float64_logprob(twin_logits, token)) < 1e-6
        assert abs(float(twin_sum[0]) - float(fused_sum[0])) < 1e-4
        forced += token >= TS
        text += token < TS
    assert forced > 10 and text > 10  # both kinds of step were compared


@pytest.mark.oracle
def test_the_fused_step_chooses_the_references_token():
    """openai-whisper's own filters and greedy choice on the same rows: the same token, its
    log-probability within PyTorch's float32 error of ours."""
    whisper = require_oracle("whisper")
    from whisper.decoding import ApplyTimestampRules
    from whisper.decoding import SuppressBlank as ReferenceBlank
    from whisper.decoding import SuppressTokens as ReferenceTokens

    tokenizer = whisper.tokenizer.get_tokenizer(False)
    assert (tokenizer.timestamp_begin, tokenizer.eot, tokenizer.no_timestamps) == (TS, EOT, NO_TS)
    suppressed = [1, 2, 7, 8, 9, 50, 51, 50_257, 50_358, 50_359, 50_360, 50_361, NO_TS]
    reference = [
        ReferenceBlank(tokenizer, BEGIN),
        ReferenceTokens(suppressed),
        ApplyTimestampRules(tokenizer, BEGIN, 50),
    ]
    choice = GreedyChoice.for_window(GreedySearch(0.0, EOT), _filters())
    compared = 0
    for x, tokens in _rows():
        theirs = x.clone()
        for f in reference:
            f.apply(theirs, tokens)
        if bool(torch.isinf(theirs).all()):
            continue
        token = int(theirs.argmax(dim=-1)[0])
        fused_sum = torch.zeros(1)
        got, _, _ = choice.update(tokens, x.clone(), fused_sum)
        if int(tokens[0, -1]) == EOT:
            assert int(got[0, -1]) == EOT
            continue
        assert int(got[0, -1]) == token
        assert abs(float(fused_sum[0]) - float(torch.log_softmax(theirs, dim=-1)[0, token])) < 1e-4
        compared += 1
    assert compared > 100


def test_a_near_tie_of_the_timestamp_rule_goes_to_the_twin():
    """Timestamps' total probability equal to the best text token's, to 1e-5: not decided by the kernel."""
    choice = GreedyChoice.for_window(GreedySearch(0.0, EOT), _filters())
    x = torch.full((1, N_VOCAB), -30.0)
    x[0, 500] = 2.0  # the best text token
    x[0, TS + 10 : TS + 12] = 2.0 - math.log(2.0) + 1e-5  # two stamps whose total is e^2 (and a hair)
    tokens = torch.tensor([[50_257, 50_362, 50_363, TS, 400]])
    twin_logits = x.clone()
    expected, _, _ = choose_next(
        None, _filters(), GreedySearch(0.0, EOT), tokens, twin_logits, torch.zeros(1)
    )
    before = choice.twin_rows
    got, _, _ = choice.update(tokens, x.clone(), torch.zeros(1))
    assert choice.twin_rows == before + 1
    assert torch.equal(got, expected)


def test_no_timestamp_rules_and_batches_of_rows():
    """Without timestamps (one part: every id is text) and several rows a call, each its own choice."""
    filters = [SuppressTokens([5, 6, 7])]
    choice = GreedyChoice.for_window(GreedySearch(0.0, EOT), filters)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, N_VOCAB, generator=g)
    x[2, 6] = 50.0  # suppressed: must not win
    tokens = torch.tensor([[1, 2, 3]] * 3 + [[1, 2, EOT]])
    twin_logits, twin_sum = x.clone(), torch.zeros(4)
    expected, _, _ = choose_next(None, filters, GreedySearch(0.0, EOT), tokens, twin_logits, twin_sum)
    fused_sum = torch.zeros(4)
    got, _, _ = choice.update(tokens, x.clone(), fused_sum)
    assert torch.equal(got, expected) and int(got[2, -1]) != 6 and int(got[3, -1]) == EOT
    for r in range(3):
        assert abs(float(fused_sum[r]) - _float64_logprob(twin_logits[r : r + 1], int(got[r, -1]))) < 1e-6


def test_where_it_does_not_apply_the_twin_runs():
    assert GreedyChoice.for_window(GreedySearch(0.7, EOT), _filters()) is None  # sampling
    assert GreedyChoice.for_window(BeamSearch(5, EOT), _filters()) is None
    assert GreedyChoice.for_window(GreedySearch(0.0, EOT), [*_filters(), object()]) is None
    choice = GreedyChoice.for_window(GreedySearch(0.0, EOT), _filters())
    x, tokens = _rows()[1]
    twin, _, _ = choose_next(None, _filters(), GreedySearch(0.0, EOT), tokens, x.clone(), torch.zeros(1))
    before = choice.twin_rows
    got, _, _ = choice.update(tokens, x.double(), torch.zeros(1))  # float64 logits: not the kernel's
    assert torch.equal(got, twin) and choice.twin_rows == before


def _kernel(path: Path | None = None):
    if path is None:
        fn = greedy_choice_module._kernel_fn()
    else:
        fn = ctypes.CDLL(str(path)).wkv_greedy_row
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long]
        fn.argtypes += [ctypes.c_void_p] * 3
    return fn


def _check_kernel(fn) -> None:  # noqa: ANN001 - a ctypes function
    g = torch.Generator().manual_seed(5)
    for trial in range(60):
        n = int(torch.randint(1, 3000, (1,), generator=g)) if trial % 4 else N_VOCAB
        split = int(torch.randint(0, n + 1, (1,), generator=g))
        x = torch.randn(n, generator=g) * 4
        if trial % 3 == 0:
            x = (x * 2).round() / 2
        if trial % 7 == 0:
            x[:split] = NEG_INF
        lo = int(torch.randint(0, n, (1,), generator=g))
        ranges = np.array([[lo, min(n, lo + 37)], [0, min(n, 3)], [n, n]], dtype=np.int64)
        top, first, sums = np.empty(2, np.float32), np.empty(2, np.int64), np.empty(2, np.float64)
        row = x.clone()
        status = fn(
            row.data_ptr(),
            n,
            split,
            ranges.ctypes.data,
            3,
            top.ctypes.data,
            first.ctypes.data,
            sums.ctypes.data,
        )
        assert status == 0
        expected = x.clone().numpy()
        for a, b in ranges:
            expected[a:b] = NEG_INF
        assert np.array_equal(row.numpy(), expected)  # the fills, and nothing else
        for p, (a, b) in enumerate(((0, split), (split, n))):
            part = expected[a:b].astype(np.float64)
            if part.size == 0 or np.all(part == NEG_INF):
                assert top[p] == NEG_INF and first[p] == a and sums[p] == 0.0
                continue
            assert top[p] == part.max() and first[p] == a + int(np.argmax(part))
            assert sums[p] == pytest.approx(np.exp(part - part.max()).sum(), rel=1e-6)
    top, first, sums = np.empty(2, np.float32), np.empty(2, np.int64), np.empty(2, np.float64)
    row = torch.zeros(10)
    for split, ranges in ((11, [[0, 1]]), (-1, [[0, 1]]), (5, [[3, 2]]), (5, [[0, 11]]), (5, [[-1, 2]])):
        bad = np.array(ranges, dtype=np.int64)
        args = (top.ctypes.data, first.ctypes.data, sums.ctypes.data)
        assert fn(row.data_ptr(), 10, split, bad.ctypes.data, 1, *args) == -1
        assert torch.equal(row, torch.zeros(10))  # refused before writing anything


def test_the_kernel_against_numpy_in_float64():
    _check_kernel(_kernel())


def test_the_plain_c_version_of_the_kernel(tmp_path: Path):
    """The library is built with -march=native (AVX-512 here); the version without it, built here."""
    flags = ("-O3", "-ffast-math", "-fPIC", "-mno-avx512f")
    _check_kernel(_kernel(compile_library(COMPILER, tmp_path / "greedy_choice.so", flags, (SOURCE,))))


def _segments(result: dict) -> list[tuple]:
    return [(s["seek"], s["start"], s["end"], s["text"], s["tokens"]) for s in result["segments"]]


def test_transcripts_with_and_without_the_fused_step(tiny_model, monkeypatch):
    """Segments (tokens, timestamps, text) equal; avg_logprob within PyTorch's float32 rounding."""
    audio = speech_audio("long/lj001_0001-0032_concat.flac", seconds=45)
    fused = tiny_model.transcribe(audio, language="en")
    monkeypatch.setattr(greedy_choice_module, "_kernel_fn", lambda: None)
    twin = tiny_model.transcribe(audio, language="en")
    assert len(fused["segments"]) > 3
    assert _segments(fused) == _segments(twin)
    for a, b in zip(fused["segments"], twin["segments"]):
        assert a["avg_logprob"] == pytest.approx(b["avg_logprob"], abs=1e-4)


def test_an_int8_window_with_and_without_the_fused_step(int8_model, monkeypatch):
    audio = speech_audio("en/ls_1089-134686-0000.flac")
    fused = int8_model.transcribe(audio, language="en")
    monkeypatch.setattr(greedy_choice_module, "_kernel_fn", lambda: None)
    assert _segments(int8_model.transcribe(audio, language="en")) == _segments(fused)
