"""The int8 type's bfloat16 encoder linears in AMX's bfloat16 tiles (``kernels/encoder_linear.c``), each
with what follows it: its bias, then GELU (the MLP's first linear) or the residual add (the attention's
output projection, the MLP's second).

Why: through PyTorch each of those linears is three passes over a 1,500-row output (the bias copied in,
oneDNN's product added to it, GELU or the add as another pass), each into freshly allocated memory. The
kernel finishes every 32 x 32 block of the output while its products are still in the cache, with
PyTorch's roundings to bfloat16 in PyTorch's order (bias, then GELU or the add), so the output is
PyTorch's but where a sum in another order rounds the other way. Its slow twin is the PyTorch block
(``use_attention_kernels(model, tiles=False)``); both are held to a float32 reference (tests), and the
int8 type's words are measured (``benchmarks/bench.py``).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from whisperkv.model.attention import heads

if TYPE_CHECKING:
    from whisperkv.model.encoder import EncoderBlock

BIAS, GELU, RESIDUAL = 0, 1, 2  # the kernel's epilogues
BLOCK = 32  # the kernel's output block: in and out features must be multiples of it


@dataclass(frozen=True)
class PackedLinear:
    """One linear's weight [out, in] in the tiles' layout [out/16][in/32][16 pairs][16][2], and its bias
    as float32 (its bfloat16 values, exactly)."""

    weight: torch.Tensor
    bias: torch.Tensor
    out_features: int
    in_features: int

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> PackedLinear:
        n, k = weight.shape
        packed = weight.detach().reshape(n // 16, 16, k // 32, 16, 2).permute(0, 2, 3, 1, 4).contiguous()
        bias32 = torch.zeros(n) if bias is None else bias.detach().float()
        return cls(packed, bias32.contiguous(), n, k)


class TiledEncoderLinear:
    """``epilogue(x @ weight.T + bias)`` for bfloat16 rows, where the kernels' library was built with AMX
    and Linux lends the tiles."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library
        self._fn = library.wkv_encoder_linear_bf16
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.c_void_p] + [ctypes.c_long] * 3 + [ctypes.c_void_p, ctypes.c_long]
        self._fn.argtypes += [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_long]
        self._fn.argtypes += [ctypes.c_void_p, ctypes.c_long]

    @staticmethod
    def available(library: ctypes.CDLL) -> bool:
        """Whether this library has the tile path (built with AMX) and this process may use the tiles."""
        return bool(library.wkv_encoder_linear_available())

    def __deepcopy__(self, memo: dict) -> TiledEncoderLinear:
        return self  # a loaded library: nothing in it to copy (ctypes handles cannot be)

    def __reduce__(self) -> tuple:
        return (_reload, ())  # another process loads (or builds) its own

    @staticmethod
    def takes(linear: nn.Linear) -> bool:
        """A bfloat16 linear whose shapes the kernel's 32 x 32 blocks divide."""
        n, k = linear.weight.shape
        return linear.weight.dtype == torch.bfloat16 and n % BLOCK == 0 and k % BLOCK == 0

    def __call__(
        self, x: torch.Tensor, layer: PackedLinear, epilogue: int = BIAS, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x`` [..., in] (bfloat16) → [..., out]; ``residual`` [..., out] with ``RESIDUAL``."""
        if x.dtype != torch.bfloat16 or x.shape[-1] != layer.in_features:
            shape = f"bfloat16 [..., {layer.in_features}], not {x.dtype} {tuple(x.shape)}"
            raise ValueError(f"the tiled linear takes {shape}")
        rows = x.reshape(-1, layer.in_features)
        if rows.stride(1) != 1:
            rows = rows.contiguous()
        out = torch.empty(*x.shape[:-1], layer.out_features, dtype=torch.bfloat16)
        res, res_stride = None, 0
        if epilogue == RESIDUAL:
            if residual is None or residual.shape != out.shape or residual.dtype != torch.bfloat16:
                raise ValueError("the residual must be bfloat16 and shaped like the output")
            res = residual.reshape(-1, layer.out_features)
            res = res if res.stride(1) == 1 else res.contiguous()
            res_stride = res.stride(0)
        done = self._fn(
            rows.data_ptr(), rows.shape[0], layer.in_features, rows.stride(0), layer.weight.data_ptr(),
            layer.out_features, layer.bias.data_ptr(), epilogue, None if res is None else res.data_ptr(),
            res_stride, out.data_ptr(), layer.out_features,
        )  # fmt: skip
        if done != 1:
            raise RuntimeError(f"the tiled encoder linear failed (status {done}: no tiles or no memory)")
        return out


class EncoderBlockTiles:
    """One encoder block's four linears packed for the tiles: ``forward`` is ``EncoderBlock.forward``'s
    fast twin (its LayerNorms and attention as they are). Packed again if a weight changed since."""

    def __init__(self, linear: TiledEncoderLinear, block: EncoderBlock) -> None:
        self.linear = linear
        self._pack(block)

    @staticmethod
    def takes(block: EncoderBlock) -> bool:
        return all(TiledEncoderLinear.takes(layer) for layer in _linears(block))

    def _sources(self, block: EncoderBlock) -> tuple:
        params = [p for layer in _linears(block) for p in layer.parameters()]
        return tuple((p.data_ptr(), p._version) for p in params)

    def _pack(self, block: EncoderBlock) -> None:
        weight, bias = block.attn.qkv_parameters()
        self.qkv = PackedLinear.of(weight, bias)
        self.out = PackedLinear.of(block.attn.out.weight, block.attn.out.bias)
        fc1, _, fc2 = block.mlp
        self.fc1 = PackedLinear.of(fc1.weight, fc1.bias)
        self.fc2 = PackedLinear.of(fc2.weight, fc2.bias)
        self.sources = self._sources(block)

    def forward(self, block: EncoderBlock, x: torch.Tensor) -> torch.Tensor:
        if self._sources(block) != self.sources:
            self._pack(block)
        attn = block.attn
        q, k, v = self.linear(block.attn_ln(x), self.qkv).chunk(3, dim=-1)
        attended = attn.attention(q, heads(k, attn.n_head), heads(v, attn.n_head))
        x = self.linear(attended, self.out, RESIDUAL, x)
        hidden = self.linear(block.mlp_ln(x), self.fc1, GELU)
        return self.linear(hidden, self.fc2, RESIDUAL, x)


def _linears(block: EncoderBlock) -> tuple[nn.Linear, ...]:
    attn, (fc1, _, fc2) = block.attn, block.mlp
    return attn.query, attn.key, attn.value, attn.out, fc1, fc2


def _reload() -> TiledEncoderLinear:
    from whisperkv.model.attend_kernel import load_kernel

    kernel = load_kernel()
    if kernel is None:
        raise RuntimeError("the C kernels could not be built in this process")
    return TiledEncoderLinear(kernel.library)
