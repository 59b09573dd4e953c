"""The bfloat16 compute type's decoder linears and token table, and the C kernel that multiplies them.

Why: a decoder step reads every weight once, so its time follows the bytes read; the float32 type
already holds its linears in float16 where exact (2 bytes), so bfloat16 weights read no fewer bytes
there. What bfloat16 adds is arithmetic: AVX512-BF16's ``vdpbf16ps`` makes 32 products a instruction
from bfloat16 rows and weights, twice a float32 fused multiply-add's, with no widening
(``kernels/bf16_rows.c``), and half-size Self-KV and Cross-KV (``cpu/plan.py``).

``Bfloat16Linear`` computes ``bfloat16(x) @ bfloat16(W)ᵀ + b`` with float32 sums and bias: the rows are
rounded to bfloat16 once per call (to nearest, ties to even), the weights once at load. Through the
kernel where the CPU has AVX512-BF16 and the library builds; elsewhere through PyTorch's float32
product of the same bfloat16 values (``reference``: the twin, the same numbers but for the order of
the sums). The token table is held once, in the vocabulary linear's packing, and looked up from it
(``Bfloat16Embedding``).
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import nn

from whisperkv.cpu.attend import load_kernel
from whisperkv.cpu.flags import cpu_has_avx512_bf16

GROUP = 64  # outputs per packed group (GROUP in bf16_rows.c)
LANES = 16  # the input width must be a multiple of it
PACK_ROWS = 4096  # rows rounded and packed at a time (a multiple of GROUP): no whole bfloat16 copy at load


class Bf16RowsKernel:
    """``pack`` bfloat16 weights once; then ``y = bfloat16(x) Wᵀ + b`` for any number of float32 rows."""

    def __init__(self, library: ctypes.CDLL) -> None:
        pointer, long = ctypes.c_void_p, ctypes.c_long
        self._rows = library.wkv_bf16_rows
        self._rows.restype = ctypes.c_int
        self._rows.argtypes = [pointer, long, long, long, long, pointer, pointer, pointer]
        self._pack = library.wkv_bf16_pack
        self._pack.restype = None
        self._pack.argtypes = [pointer, long, long, pointer]

    def __deepcopy__(self, memo: dict) -> Bf16RowsKernel:
        return self  # a loaded library: nothing in it to copy (ctypes handles cannot be)

    def __reduce__(self) -> tuple:
        return (load_bf16_rows_kernel, ())  # another process loads (or builds) its own

    @staticmethod
    def takes(in_features: int) -> bool:
        return in_features >= LANES and in_features % LANES == 0

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """[out, in] (any float dtype) → bfloat16 in the kernel's layout, [ceil(out / 64) * 64 * in]
        (padding outputs are 0), rounded and packed ``PACK_ROWS`` rows at a time."""
        out, width = weight.shape
        if not self.takes(width):
            raise ValueError(f"the bfloat16 rows kernel takes inputs a multiple of {LANES} wide, not {width}")
        packed = torch.empty(-(-out // GROUP) * GROUP * width, dtype=torch.bfloat16)
        for start in range(0, out, PACK_ROWS):
            rows = weight[start : start + PACK_ROWS].detach().to(torch.bfloat16).contiguous()
            at = packed[start * width :].data_ptr()
            self._pack(rows.data_ptr(), rows.shape[0], width, at)
        return packed

    def __call__(
        self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int
    ) -> torch.Tensor:
        """``x`` [..., in] float32 → [..., out_features] float32."""
        width = x.shape[-1]
        rows = x.reshape(-1, width)
        if rows.dtype != torch.float32 or rows.stride(-1) != 1:
            rows = rows.float().contiguous()
        y = torch.empty(rows.shape[0], out_features)
        if rows.shape[0]:
            failed = self._rows(
                rows.data_ptr(),
                rows.stride(0),
                rows.shape[0],
                width,
                out_features,
                packed.data_ptr(),
                None if bias is None else bias.data_ptr(),
                y.data_ptr(),
            )
            if failed:
                raise ValueError(
                    f"the bfloat16 rows kernel does not take inputs {width} wide (code {failed})"
                )
        return y.reshape(*x.shape[:-1], out_features)


def unpack(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """The kernel's layout back to bfloat16 [out, in] row-major (a copy): for the PyTorch twin."""
    groups = packed.view(-1, in_features // 2, GROUP, 2).permute(0, 2, 1, 3)
    return groups.reshape(-1, in_features)[:out_features]


class Bfloat16Linear(nn.Module):
    """``y = bfloat16(x) Wᵀ + b``: W rounded to bfloat16 at load, the rows per call; float32 sums and bias.

    ``kernel`` (where it builds, ``load_bf16_rows_kernel``): W held in its packing and multiplied in C;
    otherwise held row-major and multiplied by PyTorch in float32 (``reference``), the twin."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, kernel: Bf16RowsKernel | None = None
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.kernel = kernel if kernel is not None and kernel.takes(self.in_features) else None
        self._bias = None if bias is None else bias.detach().float().contiguous()
        self._packed = self.kernel.pack(weight) if self.kernel is not None else None
        self._weight = None if self.kernel is not None else weight.detach().to(torch.bfloat16).contiguous()

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernel: Bf16RowsKernel | None = None) -> Bfloat16Linear:
        return cls(linear.weight, linear.bias, kernel)

    @property
    def weight(self) -> torch.Tensor:
        """The bfloat16 weights [out, in], row-major (unpacked: a copy, where the kernel holds them)."""
        if self._weight is not None:
            return self._weight
        return unpack(self._packed, self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            return self.kernel(x, self._packed, self._bias, self.out_features)
        return self.reference(x)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same numbers through PyTorch: the bfloat16 values' products summed in float32."""
        return F.linear(x.to(torch.bfloat16).float(), self.weight.float(), self._bias)

    def extra_repr(self) -> str:
        how = "rows kernel" if self.kernel is not None else "pytorch"
        return f"in_features={self.in_features}, out_features={self.out_features}, bfloat16, {how}"


class Bfloat16Embedding(nn.Module):
    """The token table looked up from the vocabulary's ``Bfloat16Linear`` (tied weights, held once):
    each row widened exactly to float32."""

    def __init__(self, projection: Bfloat16Linear) -> None:
        super().__init__()
        # not a submodule: the decoder holds it as ``logits_projection`` (one entry in module walks)
        object.__setattr__(self, "projection", projection)
        self.embedding_dim = projection.in_features

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        projection, d = self.projection, self.embedding_dim
        if projection._packed is None:
            return projection._weight[tokens].float()
        ids = tokens.reshape(-1)
        groups = projection._packed.view(-1, d // 2, GROUP, 2)
        rows = groups[ids // GROUP, :, ids % GROUP, :]  # [n, d / 2, 2]
        return rows.reshape(*tokens.shape, d).float()


def load_bf16_rows_kernel() -> Bf16RowsKernel | None:
    """The kernel, from the library ``load_kernel`` builds; None where it cannot be built or the CPU
    lacks AVX512-BF16 (the library then has no kernel: ``wkv_bf16_rows_built``)."""
    if not cpu_has_avx512_bf16():
        return None
    built = load_kernel()
    if built is None or not built.library.wkv_bf16_rows_built():
        return None
    return Bf16RowsKernel(built.library)
