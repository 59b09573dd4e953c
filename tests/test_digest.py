"""Tensor digests (``cache/digest.py``): the documented scheme, whatever the thread count, and every
byte of every piece in it (the widened pieces go through two buffers in turn)."""

from __future__ import annotations

import hashlib

import pytest
import torch

from whisperkv.cache.digest import GROUP, PIECE, combine, tensor_digest


@pytest.fixture
def threads():
    """Set ``torch``'s thread count for a test, restored after it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def scheme(header: str, data: bytes) -> str:
    """The digest as the module's docstring describes it, written out with hashlib alone."""
    h = hashlib.sha256(header.encode())
    for start in range(0, len(data), PIECE):
        h.update(hashlib.sha256(data[start : start + PIECE]).digest())
    return h.hexdigest()[:24]


def float16_table(pieces_of_float32: float) -> torch.Tensor:
    """A float16 [rows, 1000] table whose float32 widening spans about this many pieces (not a whole
    number of them: the last piece is short)."""
    rows = int(pieces_of_float32 * PIECE / 4 / 1000) + 1
    return torch.randn(rows, 1000, generator=torch.Generator().manual_seed(rows)).half()


def test_the_digest_is_the_documented_scheme():
    t = torch.randn(3 * PIECE // 4 + 77, generator=torch.Generator().manual_seed(1))
    assert tensor_digest(t) == scheme(f"torch.float32{tuple(t.shape)}", t.numpy().tobytes())
    table = float16_table(2.5)
    widened = table.float().numpy().tobytes()
    assert tensor_digest(table, widen_float16=True) == scheme(f"torch.float32{tuple(table.shape)}", widened)
    assert combine(["a", "bc"]) == hashlib.sha256(b"a\0bc\0").hexdigest()[:24]
    assert combine(["a", "bc"]) != combine(["ab", "c"])


@pytest.mark.parametrize("count", [1, 2, 3, 8])  # 8: more than THREADS
def test_the_same_digest_on_any_number_of_threads(threads, count):
    table = float16_table(2 * GROUP * 3 + 1.5)  # several groups of widened pieces on any count here
    plain = torch.randn(9 * PIECE // 4 + 5, generator=torch.Generator().manual_seed(2))
    threads(1)
    want = tensor_digest(table, widen_float16=True), tensor_digest(table), tensor_digest(plain)
    threads(count)
    assert (tensor_digest(table, widen_float16=True), tensor_digest(table), tensor_digest(plain)) == want


def test_widened_float16_is_the_digest_of_its_float32_widening(threads):
    threads(2)
    table = float16_table(2 * GROUP * 2 + 2.3)
    assert tensor_digest(table, widen_float16=True) == tensor_digest(table.float())
    assert tensor_digest(table, widen_float16=True) != tensor_digest(table)  # float16's own bytes
    small = torch.tensor([0.5, -2.0], dtype=torch.float16)
    assert tensor_digest(small, widen_float16=True) == tensor_digest(small.float())


@pytest.mark.parametrize("count", [1, 2])
def test_one_number_changed_anywhere_changes_the_digest(threads, count):
    threads(count)
    table = float16_table(2 * GROUP * 2 + 2.3)
    flat = table.reshape(-1)
    digests = {tensor_digest(table, widen_float16=True)}
    # the first number, one in a middle group's middle piece, the last of the short last piece
    for index in (0, flat.numel() // 2 + 3, flat.numel() - 1):
        changed = table.clone()
        changed.reshape(-1)[index] += 1
        digests.add(tensor_digest(changed, widen_float16=True))
        assert tensor_digest(changed) != tensor_digest(table)
    assert len(digests) == 4


def test_dtype_shape_and_layout():
    t = torch.arange(12, dtype=torch.float32)
    assert tensor_digest(t) != tensor_digest(t.reshape(3, 4))  # the same bytes, another shape
    assert tensor_digest(t) != tensor_digest(t.view(torch.int32))  # the same bytes, another dtype
    assert tensor_digest(t.reshape(3, 4).t()) == tensor_digest(t.reshape(3, 4).t().contiguous())
    b = torch.randn(40, generator=torch.Generator().manual_seed(3)).bfloat16()
    bits = b.view(torch.int16).numpy().tobytes()
    assert tensor_digest(b) == scheme(f"torch.bfloat16{tuple(b.shape)}", bits)
    assert tensor_digest(torch.empty(0, 5)) == scheme("torch.float32(0, 5)", b"")
    two = torch.tensor([2.0]).numpy().tobytes()
    assert tensor_digest(torch.tensor(2.0)) == scheme("torch.float32()", two)
    assert len({tensor_digest(torch.empty(0)), tensor_digest(torch.empty(0, dtype=torch.float16))}) == 2
