"""The int8 type's encoder with int8 linears in AMX's int8 tiles, bfloat16 between them (its attention,
LayerNorms and convolutions: the bfloat16 tiles' and PyTorch's, as for the bfloat16 encoder).

Why: on a CPU with AMX for int8 as well as bfloat16, ``tdpbusd`` makes twice the products of
``tdpbf16ps`` an instruction from half the weight bytes. At large-v3-turbo's width (1,500 positions,
2 threads) the int8 kernel took 7.7 ms for each MLP linear against 12.8-13.6 ms in bfloat16 tiles, and
the encoder's weights are half as many bytes (0.63 against 1.26 GB held), which the peak memory of a
load follows. Each position is quantised on its own, as a decoder step's rows are (``int8_rows.c``'s
rule: 8 bits, its own scale and zero point, the range always holding 0); the weights as every int8
table of the model (``row_int8.py``: symmetric, one scale per output).

* ``Int8TileLinear``: one linear's int8 weights in the tiles' layout, its scales, row sums and bias (the
  only copy); ``forward`` is the kernel's PyTorch twin (the same quantised rows, their integer products
  exact in float64), what the block runs with its kernels off.
* ``EncoderBlockInt8Tiles``: ``EncoderBlock.forward`` with its four linears through the kernel, each with
  its bias, GELU or residual add (a ``BlockRunner``, ``model/encoder.py``).

An approximation, like the rest of the type: the kernel is held close to its twin, the encoder's output
to float32's, and the type's words are measured (``benchmarks/bench.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.int8_linear import Int8FusedPart
from whisperkv.cpu.row_int8 import quantized_rows, row_sums
from whisperkv.cpu.tiled_linear import TiledEncoderLinear

if TYPE_CHECKING:
    from whisperkv.model.encoder import EncoderBlock

K_BLOCK = 64  # the kernel's steps over the input width (its output blocks are 32 wide)


class Int8TileLinear(nn.Module):
    """``y = x W^T + b`` for bfloat16 rows, W int8 with one scale per output row, packed for the tiles as
    [out/16][in/64][16 groups of 4 inputs][16 outputs][4]. Plain attributes, not buffers: a ``.to()`` of
    the encoder (its LayerNorms to bfloat16) leaves the int8 numbers and their float32 scales alone."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        weight = weight.detach() if weight.dtype == torch.float16 else weight.detach().float()
        self.out_features, self.in_features = n, k = weight.shape
        qweight, self.scales = quantized_rows(weight)  # float16 rows widened a block at a time
        self.row_sums = row_sums(qweight)
        self.bias = torch.zeros(n) if bias is None else bias.detach().float().contiguous()
        self.packed = qweight.reshape(n // 16, 16, k // 64, 16, 4).permute(0, 2, 3, 1, 4).contiguous()

    @property
    def nbytes(self) -> int:
        return self.in_features * self.out_features  # one byte per weight (scales and bias aside)

    def weights(self) -> torch.Tensor:
        """The int8 weights [out, in] (a new tensor)."""
        return self.packed.permute(0, 3, 1, 2, 4).reshape(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
        """The kernel's twin: each row quantised on its own, its integer products exact (float64), then
        both scales and the bias in float32, rounded to bfloat16: slow (float64 products), a reference
        for the tests, not a fallback. ``sizes`` is ignored: a row's numbers are its own."""
        rows = x.reshape(-1, self.in_features).float()
        low, high = rows.amin(dim=1).clamp(max=0), rows.amax(dim=1).clamp(min=0)
        scale = torch.where(high > low, (high - low) / 255, torch.ones_like(high))
        inverse = 1 / scale
        zero = torch.round(-low * inverse)
        q = (torch.round(rows * inverse[:, None]) + zero[:, None]).clamp_(0, 255)
        sums = q.double() @ self.weights().double().T - zero.double()[:, None] * self.row_sums.double()
        y = (scale[:, None] * self.scales) * sums.float() + self.bias
        return y.to(torch.bfloat16).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-row, AMX tiles"


def quantize_block(block: EncoderBlock) -> None:
    """An encoder block's four linears (float32 or float16) as ``Int8TileLinear``s, in place, the query,
    key and value as one (the three layers its thirds); its LayerNorms to bfloat16."""
    attn = block.attn
    attn.fuse_qkv(Int8TileLinear)
    attn.query, attn.key, attn.value = (Int8FusedPart(attn.qkv, part) for part in range(3))
    attn.out = Int8TileLinear(attn.out.weight, attn.out.bias)
    for index in (0, 2):
        block.mlp[index] = Int8TileLinear(block.mlp[index].weight, block.mlp[index].bias)
    block.attn_ln.to(torch.bfloat16)
    block.mlp_ln.to(torch.bfloat16)


class EncoderBlockInt8Tiles:
    """``EncoderBlock.forward`` with its four ``Int8TileLinear``s through the int8 tiles; its LayerNorms
    and attention as they are."""

    def __init__(self, linear: TiledEncoderLinear) -> None:
        self.linear = linear

    @staticmethod
    def takes(block: EncoderBlock) -> bool:
        layers = (block.attn.qkv, block.attn.out, block.mlp[0], block.mlp[2])
        return all(isinstance(layer, Int8TileLinear) for layer in layers)

    def forward(self, block: EncoderBlock, x: torch.Tensor) -> torch.Tensor:
        attn, (fc1, _, fc2) = block.attn, block.mlp
        return self.linear.block(block, x, attn.qkv, attn.out, fc1, fc2)


def fits_int8_tiles(width: int) -> bool:
    """Whether the kernel's steps (64 inputs) and blocks (32 outputs) divide the linears of an encoder of
    this width ([3d, d], [d, d], [4d, d], [d, 4d]: every Whisper size's do). Inputs d and 4d in whole
    steps make every output count (3d, d, 4d) whole blocks too."""
    return width % K_BLOCK == 0


def int8_tiles_available() -> bool:
    """Whether the kernels' library was built with AMX's int8 tiles and this process may use them."""
    kernel = load_kernel()
    return kernel is not None and TiledEncoderLinear.int8_available(kernel.library)
