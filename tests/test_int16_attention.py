"""The int8 type's float32 encoder attention in 16-bit integers through AVX2 (``cpu/int16_attention.py``):
near a float64 reference, exact at the sums' bounds (no 32-bit overflow), the keys past T without
weight, a window's numbers its own, only the shapes it computes taken; the int8 encoder runs it where
the CPU has AVX2 without native bfloat16, named in the digest, and its twin (SDPA) makes the same words."""

from __future__ import annotations

import pytest
import torch

import whisperkv
from tests.conftest import INT8_CLIPS, SPEECH_DIR, encoder_qkv, torch_threads
from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.flags import cpu_has_bfloat16_products
from whisperkv.cpu.int16_attention import Int16EncoderAttention
from whisperkv.cpu.plan import use_attention_kernels
from whisperkv.metrics import normalize_text
from whisperkv.model.attention import attend

HEAD = 64


@pytest.fixture(scope="module")
def int16() -> Int16EncoderAttention:
    kernel = load_kernel()
    if kernel is None or not Int16EncoderAttention.available(kernel.library):
        pytest.skip("no AVX2 and FMA on this CPU (or no C compiler): the int8 encoder keeps SDPA")
    return Int16EncoderAttention(kernel.library)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return attend(q.double(), k.double(), v.double()).float()


SHAPES = [(1, 6, 1500), (2, 8, 1500), (1, 6, 17), (3, 4, 100), (1, 6, 2), (2, 3, 1)]  # windows, heads, T


@pytest.mark.parametrize("windows,heads,positions", SHAPES)
def test_near_a_float64_reference(int16, windows, heads, positions):
    """Every position (whole spans of 16 keys, tails, fewer than 4 queries), head and window: ~4e-4 of the
    values' size from float64 (13-bit queries and keys, 12-bit values, 15-bit weights); a wrong key,
    pair, column or scale is ~1 off."""
    g = torch.Generator().manual_seed(positions)
    q, k, v = encoder_qkv(torch.randn(windows, positions, 3 * heads * HEAD, generator=g) * 2, heads)
    assert int16.accepts(q, k, v, None) == (positions > 1)
    got = int16(q, k, v)
    assert got.dtype == torch.float32 and got.shape == q.shape and got.is_contiguous()
    error = (got - _reference(q, k, v)).abs()
    size = v.abs().mean()
    assert error.mean() < 5e-4 * size and error.max() < 1e-2 * size, (error.mean() / size, error.max() / size)


def test_its_sums_stay_exact_at_their_bounds(int16):
    """The largest sums the kernel can meet: every query and key at its full 13 bits (64 products of
    4,095 x 4,095), every value at its full 16 bits, probabilities spread evenly over 1,500 keys (their
    rounded sum the largest) or all on one key (32,767 x 32,767). A 32-bit overflow would be far off."""
    t, heads = 1500, 2
    g = torch.Generator().manual_seed(3)
    # a column's values all of one sign: the partial sums only grow (+7 or -7: 2,047 when quantised)
    signs = (torch.randint(0, 2, (1, 1, heads * HEAD), generator=g).float() * 2 - 1).expand(1, t, -1)
    ones = torch.ones(1, t, heads * HEAD)
    q, k, v = encoder_qkv(torch.cat([ones, ones, signs * 7.0], dim=-1), heads)
    even = int16(q, k, v)  # every score equal: the mean of the values (1,500 weights of 666.7 round to 667)
    assert (even - v.mean(dim=2).transpose(0, 1).reshape(1, 1, -1)).abs().max() < 7.0 * 1e-3
    keys = torch.randn(1, t, heads * HEAD, generator=g)
    q, k, v = encoder_qkv(torch.cat([keys * 50, keys, signs * 7.0], dim=-1), heads)
    sharp = int16(q, k, v)  # each query far nearest its own key: that key's value
    assert (sharp - v.transpose(1, 2).reshape(1, t, -1)).abs().max() < 1e-3


def test_a_query_of_zeros_weighs_every_real_key_alike_and_no_padding(int16):
    """T = 17 pads the keys to 32: a query of zeros gives every score 0, so the output is the mean of the
    17 values; a key past T taking weight would pull it toward 0."""
    g = torch.Generator().manual_seed(4)
    qkv = torch.randn(1, 17, 3 * 2 * HEAD, generator=g) + 3.0
    qkv[..., : 2 * HEAD] = 0.0
    q, k, v = encoder_qkv(qkv, 2)
    got = int16(q, k, v)
    assert (got - v.mean(dim=2).transpose(0, 1).reshape(1, 1, -1)).abs().max() < 1e-3


def test_a_windows_numbers_are_its_own_with_one_thread_or_two(int16):
    g = torch.Generator().manual_seed(1)
    q, k, v = encoder_qkv(torch.randn(3, 1500, 3 * 6 * HEAD, generator=g), 6)
    with torch_threads(2):
        together = int16(q, k, v)
    for w in range(3):
        assert torch.equal(int16(q[w : w + 1], k[w : w + 1], v[w : w + 1]), together[w : w + 1])
    with torch_threads(1):
        assert torch.equal(int16(q, k, v), together)
    # three tensors laid out alike (the unfused projection's) give the fused views' bits
    apart = [x.transpose(1, 2).reshape(3, 1500, -1).clone() for x in (k, v)]
    k2, v2 = (x.view(3, 1500, 6, HEAD).transpose(1, 2) for x in apart)
    assert torch.equal(int16(q.contiguous(), k2, v2), together)


def test_it_takes_only_what_it_computes(int16):
    g = torch.Generator().manual_seed(2)
    q, k, v = encoder_qkv(torch.randn(2, 40, 3 * 6 * HEAD, generator=g), 6)
    assert int16.accepts(q, k, v, None)
    assert not int16.accepts(q, k, v, 0)  # a mask: the decoder's
    assert not int16.accepts(q.bfloat16(), k.bfloat16(), v.bfloat16(), None)  # bfloat16: other kernels
    assert not int16.accepts(q[:, :1], k[:, :, :1], v[:, :, :1], None)  # one position: a step
    assert not int16.accepts(q, k.contiguous(), v.contiguous(), None)  # keys laid out unlike the queries


def test_the_int8_encoder_runs_it_and_its_twin_makes_the_same_words(int16):
    model = whisperkv.load_model("tiny.en", compute_type="int8")
    if model.encoder_dtype != torch.float32 or cpu_has_bfloat16_products():
        pytest.skip("native bfloat16 here: the int8 encoder attends in bfloat16")
    assert all(isinstance(b.attn.kernel, Int16EncoderAttention) for b in model.encoder.blocks)
    assert model.weights_digest.endswith("encoder int16 kernel)")
    audio = [whisperkv.load_audio(SPEECH_DIR / clip) for clip in INT8_CLIPS]

    def words() -> list[list[str]]:
        return [normalize_text(whisperkv.transcribe(model, a)["text"]).split() for a in audio]

    fast = words()
    use_attention_kernels(model, tiles=False)  # the twin: SDPA in float32
    assert all(b.attn.kernel is None for b in model.encoder.blocks)
    assert model.weights_digest.endswith("encoder sdpa)")
    assert words() == fast


def test_another_process_gets_its_own_kernel_of_the_same_kind(int16):
    """Ray workers and the server's processes unpickle the model: each kernel loads its own library."""
    import pickle

    again = pickle.loads(pickle.dumps(int16))
    assert type(again) is Int16EncoderAttention and again.DTYPE == torch.float32
    g = torch.Generator().manual_seed(5)
    q, k, v = encoder_qkv(torch.randn(1, 40, 3 * 2 * HEAD, generator=g), 2)
    assert torch.equal(again(q, k, v), int16(q, k, v))
