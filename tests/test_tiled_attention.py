"""The int8 type's bfloat16 encoder attention in AMX's tiles (``cpu/tiled_attention.py``): as close to
a float32 reference as SDPA's bfloat16 path (its twin), a window's numbers its own, only the shapes it
computes taken, and the int8 type's transcripts with it those it makes with SDPA."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import encoder_qkv, int8_words, torch_threads
from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.tiled_attention import TiledEncoderAttention
from whisperkv.metrics import word_errors
from whisperkv.model.attention import attend

HEAD = 64


@pytest.fixture(scope="module")
def tiles() -> TiledEncoderAttention:
    kernel = load_kernel()
    if kernel is None or not TiledEncoderAttention.available(kernel.library):
        pytest.skip("no AMX bfloat16 tiles on this CPU (or no C compiler): the encoder keeps SDPA")
    return TiledEncoderAttention(kernel.library)


SHAPES = [(1, 6, 1500), (2, 8, 1500), (1, 6, 17), (3, 4, 100), (1, 6, 2)]  # windows, heads, positions


@pytest.mark.parametrize("windows,heads,positions", SHAPES)
def test_as_close_to_float32_as_sdpas_bfloat16_path(tiles, windows, heads, positions):
    """Every position (whole blocks of 16 keys and queries, tails, fewer than 16), every head, every
    window: within SDPA's own bfloat16 error of the float32 answer (a wrong key, pair or tile is ~1 off)."""
    g = torch.Generator().manual_seed(positions)
    qkv = (torch.randn(windows, positions, 3 * heads * HEAD, generator=g) * 2).bfloat16()
    q, k, v = encoder_qkv(qkv, heads)
    assert tiles.accepts(q, k, v, None)
    got = tiles(q, k, v)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape and got.is_contiguous()
    want = attend(*(x.float() for x in (q, k, v)))
    ours = (got.float() - want).abs()
    sdpa = (attend(q, k, v).float() - want).abs()
    assert ours.mean() <= 1.1 * sdpa.mean() + 1e-5, (ours.mean(), sdpa.mean())
    assert ours.max() <= 1.5 * sdpa.max() + 1e-3, (ours.max(), sdpa.max())


def test_a_windows_numbers_are_its_own_with_one_thread_or_two(tiles):
    g = torch.Generator().manual_seed(1)
    q, k, v = encoder_qkv(torch.randn(3, 1500, 3 * 6 * HEAD, generator=g).bfloat16(), 6)
    with torch_threads(2):
        together = tiles(q, k, v)
    for w in range(3):
        assert torch.equal(tiles(q[w : w + 1], k[w : w + 1], v[w : w + 1]), together[w : w + 1])
    with torch_threads(1):
        assert torch.equal(tiles(q, k, v), together)


def test_it_takes_only_what_it_computes(tiles):
    g = torch.Generator().manual_seed(2)
    q, k, v = encoder_qkv(torch.randn(2, 40, 3 * 6 * HEAD, generator=g).bfloat16(), 6)
    assert tiles.accepts(q, k, v, None)
    assert not tiles.accepts(q, k, v, 0)  # a mask: the decoder's
    assert not tiles.accepts(q.float(), k.float(), v.float(), None)  # float32: SDPA
    assert not tiles.accepts(q[:, :1], k[:, :, :1], v[:, :, :1], None)  # one position: a step
    assert not tiles.accepts(q, k.contiguous(), v.contiguous(), None)  # keys laid out unlike the queries
    assert not tiles.accepts(q[:1], k, v, None)  # windows do not match
    # three tensors laid out alike (separate query, key and value projections) are taken
    separate = [torch.randn(2, 40, 6 * HEAD, generator=g).bfloat16() for _ in range(3)]
    q2, k2, v2 = separate[0], *(x.view(2, 40, 6, HEAD).transpose(1, 2) for x in separate[1:])
    assert tiles.accepts(q2, k2, v2, None)
    want = attend(q2.float(), k2.float(), v2.float())
    assert (tiles(q2, k2, v2).float() - want).abs().max() < 3e-2


def test_the_int8_types_transcripts_with_tiles_are_those_with_sdpa(tiles, int8_bf16_encoder_model):
    """Real speech, the int8 type's whole model: its words with the tiles and with SDPA's bfloat16 path.
    An approximation's words, so at most one of them differs: on round 18's Xeon, lj_LJ001-0007's
    "Gutenberg" (a name) came out "gudenberg" with the tiles and "guttenburg" with SDPA."""
    int8_model = int8_bf16_encoder_model
    if not isinstance(int8_model.encoder.blocks[0].attn.kernel, TiledEncoderAttention):
        pytest.skip("this int8 model's encoder is not bfloat16 here")
    # the attention alone: the linears through PyTorch both ways
    texts = {on: int8_words(int8_model, tiles=on, linears=False) for on in (True, False)}
    assert texts[True][0] == texts[False][0]  # jfk
    assert sum(word_errors(a, b)[0] for a, b in zip(texts[False], texts[True], strict=True)) <= 1
