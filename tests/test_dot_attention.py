"""The bfloat16 encoder's attention through AVX512-BF16's dot product (``cpu/dot_attention.py``): as
close to a float32 reference as SDPA's bfloat16 path, closer than head by head (its twin), a window's
numbers its own, only the shapes it computes taken; the bfloat16 type's encoder runs it, named in the
digest, and its twin makes the same words."""

from __future__ import annotations

import jiwer
import pytest
import torch

import whisperkv
from tests.conftest import INT8_CLIPS, SPEECH_DIR, encoder_qkv, torch_threads
from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.dot_attention import DotEncoderAttention
from whisperkv.cpu.head_by_head import HeadByHeadAttention
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.metrics import normalize_text
from whisperkv.model.attention import attend

HEAD = 64


@pytest.fixture(scope="module")
def dot() -> DotEncoderAttention:
    kernel = load_kernel()
    if kernel is None or not DotEncoderAttention.available(kernel.library):
        pytest.skip("no AVX512-BF16 on this CPU (or no C compiler): the bfloat16 encoder goes head by head")
    return DotEncoderAttention(kernel.library)


SHAPES = [(1, 6, 1500), (2, 8, 1500), (1, 6, 17), (3, 4, 100), (1, 6, 2)]  # windows, heads, positions


@pytest.mark.parametrize("windows,heads,positions", SHAPES)
def test_as_close_to_float32_as_sdpas_bfloat16_path(dot, windows, heads, positions):
    """Every position (whole spans of 64 keys, tails, fewer than 4 queries), every head and window:
    within SDPA's own bfloat16 error of the float32 answer (a wrong key, pair or column is ~1 off), and
    nearer it than head by head, which rounds the scores to bfloat16 too."""
    g = torch.Generator().manual_seed(positions)
    q, k, v = encoder_qkv(
        (torch.randn(windows, positions, 3 * heads * HEAD, generator=g) * 2).bfloat16(), heads
    )
    assert dot.accepts(q, k, v, None)
    got = dot(q, k, v)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape and got.is_contiguous()
    want = attend(*(x.float() for x in (q, k, v)))
    ours, sdpa = (got.float() - want).abs(), (attend(q, k, v).float() - want).abs()
    assert ours.mean() <= 1.1 * sdpa.mean() + 1e-5, (ours.mean(), sdpa.mean())
    assert ours.max() <= 1.5 * sdpa.max() + 1e-3, (ours.max(), sdpa.max())
    head_by_head = (HeadByHeadAttention()(q, k, v).float() - want).abs()
    assert ours.mean() < head_by_head.mean()


def test_a_windows_numbers_are_its_own_with_one_thread_or_two(dot):
    g = torch.Generator().manual_seed(1)
    q, k, v = encoder_qkv(torch.randn(3, 1500, 3 * 6 * HEAD, generator=g).bfloat16(), 6)
    with torch_threads(2):
        together = dot(q, k, v)
    for w in range(3):
        assert torch.equal(dot(q[w : w + 1], k[w : w + 1], v[w : w + 1]), together[w : w + 1])
    with torch_threads(1):
        assert torch.equal(dot(q, k, v), together)


def test_it_takes_only_what_it_computes(dot):
    g = torch.Generator().manual_seed(2)
    q, k, v = encoder_qkv(torch.randn(2, 40, 3 * 6 * HEAD, generator=g).bfloat16(), 6)
    assert dot.accepts(q, k, v, None)
    assert not dot.accepts(q, k, v, 0)  # a mask: the decoder's
    assert not dot.accepts(q.float(), k.float(), v.float(), None)  # float32: SDPA
    assert not dot.accepts(q[:, :1], k[:, :, :1], v[:, :, :1], None)  # one position: a step
    assert not dot.accepts(q, k.contiguous(), v.contiguous(), None)  # keys laid out unlike the queries


def test_the_bfloat16_encoder_runs_it_and_its_twin_makes_the_same_words(dot):
    model = whisperkv.load_model("tiny.en", compute_type="bfloat16")
    use_attention_kernels(model, head_by_head=True)  # the default without AMX (with it: its tiles)
    assert all(isinstance(b.attn.kernel, DotEncoderAttention) for b in model.encoder.blocks)
    assert model.weights_digest.endswith("encoder dot kernel)")
    audio = [whisperkv.load_audio(SPEECH_DIR / clip) for clip in INT8_CLIPS]

    def words() -> list[list[str]]:
        return [normalize_text(whisperkv.transcribe(model, a)["text"]).split() for a in audio]

    fast = words()
    use_attention_kernels(model, head_by_head=True, tiles=False)  # the twin: head by head in PyTorch
    assert all(isinstance(b.attn.kernel, HeadByHeadAttention) for b in model.encoder.blocks)
    assert model.weights_digest.endswith("encoder head-by-head)")
    # both approximate (bfloat16 scores, rounded differently): they agree but for a word at most (none
    # differed on a Zen 4; one on an AMX Xeon, lj_LJ001-0007's "gudenberg" / "gudenburg")
    twin = words()
    differ = sum(jiwer.process_words(" ".join(a), " ".join(b)).wer * len(a) for a, b in zip(twin, fast))
    assert round(differ) <= 1 and sum(map(len, fast)) >= 50, (fast, twin)
