"""The int8 compute type's layers: a linear with int8 weights (one scale per output row) and an int8
token embedding. Why and where they are used: ``cpu/quantize.py``."""

from __future__ import annotations

import warnings

import torch
from torch import nn

from whisperkv.cpu.flags import cpu_has_vnni
from whisperkv.cpu.int8_rows import LANES, Int8RowsKernel
from whisperkv.cpu.row_int8 import quantized_rows, row_blocks, row_scales, row_sums


class Int8Linear(nn.Module):
    """``y = x W^T + b`` with W stored as int8, one scale per output row (symmetric, no zero point).

    Activations are quantised dynamically to 8 bits over their full range; with VNNI the products
    cannot saturate, so the reduced 7-bit range older CPUs need is not used there. ``kernel`` (the
    decoder's layers, where the C kernel builds): each row quantised on its own, through
    ``cpu/int8_rows.py``; otherwise PyTorch's quantized linear (fbgemm), one scale for all rows.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        kernel: Int8RowsKernel | None = None,
        rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """``rows``: ``weight``'s int8 rows and scales, already made (``quantized_rows``),
        for the rows kernel to pack (the vocabulary table's, shared with ``Int8Embedding``)."""
        super().__init__()
        # float16 rows are widened a block at a time by ``row_scales`` / ``quantized_rows`` (exactly, as
        # a float32 copy would be): no float32 copy of a whole vocabulary table while loading
        weight = weight.detach() if weight.dtype == torch.float16 else weight.detach().float()
        self.in_features = weight.shape[1]
        self.out_features = weight.shape[0]
        self.kernel = kernel if kernel is not None and kernel.takes(self.in_features) else None
        if self.kernel is not None:
            qweight, scales = rows if rows is not None else quantized_rows(weight)
            self._row_sums = row_sums(qweight)
            self._scales = scales
            self._bias = None if bias is None else bias.detach().float().contiguous()
            self._packed = self.kernel.pack(qweight)
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantised tensor types announce their future move
            self._packed = torch.ops.quantized.linear_prepack(
                per_channel_qint8(weight), None if bias is None else bias.detach().float()
            )
        self.reduce_range = not cpu_has_vnni()
        op = torch.ops.quantized.linear_dynamic.default
        self._op = getattr(op, "_op", op)  # the bound C++ kernel: skips ~4 µs of Python dispatch per call

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernel: Int8RowsKernel | None = None) -> Int8Linear:
        return cls(linear.weight, linear.bias, kernel)

    @property
    def nbytes(self) -> int:
        return self.in_features * self.out_features  # one byte per weight (scales and bias aside)

    #: ``linear_rows`` passes how a step's rows group into caches (``cpu/row_gemm.py``)
    groups_rows = True

    def forward(self, x: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
        if self.kernel is not None:
            return self.kernel(x, self._packed, self._scales, self._row_sums, self._bias, self.out_features)
        return self._fbgemm(x, sizes)

    def _fbgemm(self, x: torch.Tensor, sizes: list[int] | None) -> torch.Tensor:
        """fbgemm quantises all the rows of a call with one scale, so one call per group whose numbers
        must not depend on the others: each cache's rows of a decoder step (``sizes``), else each
        window of a batch (``x`` [B, T, d]). One call for all made a window encoded in a batch differ
        from it encoded alone by up to 8.2 in its features (AVX2 CPU, tiny.en, round 48)."""
        if sizes is None:
            sizes = [1] * x.shape[0] if x.dim() == 3 else [x.shape[0]]
        if len(sizes) == 1:
            return self._op(x, self._packed, self.reduce_range)
        return torch.cat([self._op(part, self._packed, self.reduce_range) for part in x.split(sizes)])

    def extra_repr(self) -> str:
        how = "rows kernel" if self.kernel is not None else "fbgemm"
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-row, {how}"


def per_channel_qint8(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] (float32 or float16) as fbgemm's per-row qint8 tensor with ``row_scales``:
    what ``torch.quantize_per_channel`` makes (round(w x float32(1 / scale)), in -128..127; tested
    against it), a few rows at a time through vectorised ops, where that call took 4.7 of a 15 s
    large-v3-turbo load on one thread and a whole float32 copy of the weight."""
    scales = row_scales(weight)
    inverse = 1.0 / scales
    qweight = torch.empty(weight.shape, dtype=torch.int8)
    for rows in row_blocks(weight):
        block = weight[rows].to(torch.float32, copy=True)
        qweight[rows] = block.mul_(inverse[rows, None]).round_().clamp_(-128, 127)
    zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
    return torch._make_per_channel_quantized_tensor(qweight, scales.double(), zero_points, 0)


class Int8FusedPart(nn.Module):
    """Query, key or value of a fused int8 query|key|value layer: its third of that layer's output.

    Why: the three separate int8 layers held the fused layer's int8 rows a second time (157 MB in
    large-v3-turbo's encoder) only for the paths that project one of them alone (the reference decoder's
    ``forward_uncached``: language detection, the uncached twin). Each output is its own row's int8
    products and scale, whichever rows are computed beside it, so the third is what the separate layer
    gave (the key's zero bias adds nothing).
    """

    #: ``linear_rows`` passes how a step's rows group into caches, as to ``Int8Linear``
    groups_rows = True

    def __init__(self, fused: Int8Linear, part: int) -> None:
        super().__init__()
        object.__setattr__(self, "fused", fused)  # not a submodule: the attention holds it as ``qkv``
        self.part = part
        self.in_features = fused.in_features
        self.out_features = fused.out_features // 3

    def forward(self, x: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
        return self.fused(x, sizes).chunk(3, dim=-1)[self.part]

    def extra_repr(self) -> str:
        return f"{('query', 'key', 'value')[self.part]} of the fused int8 query|key|value"


class Int8Embedding(nn.Module):
    """Token embedding rows stored as int8 with one scale per row, dequantised on lookup.

    The int8 type's logits already come from an int8 copy of this table; keeping the float32 table as
    well only for the lookup of one token per step held 80 MB (tiny.en) for nothing. Where the
    vocabulary's ``Int8Linear`` holds the rows for the rows kernel (``projection``), they are looked up
    from its packed blocks (16 rows x 4 inputs a line) with its scales: the same int8 rows, held once
    (large-v3-turbo: 63 MB less), as ``Bfloat16Embedding`` does for the bfloat16 type.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        rows: tuple[torch.Tensor, torch.Tensor] | None = None,
        projection: Int8Linear | None = None,
    ) -> None:
        """``rows``: ``weight``'s int8 rows and scales, already made (as ``Int8Linear`` takes them);
        ``projection``: the vocabulary made from them, whose packed rows are read where it has them."""
        super().__init__()
        weight = weight.detach()
        self.embedding_dim = weight.shape[1]
        packed = projection is not None and projection.kernel is not None
        # not a submodule: the decoder holds it as ``logits_projection`` (one entry in module walks)
        object.__setattr__(self, "projection", projection if packed else None)
        if packed:
            self.register_buffer("qweight", None)
            self.register_buffer("scale", projection._scales[:, None])  # a view: the same scales
            return
        qweight, scale = rows if rows is not None else quantized_rows(weight)
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale[:, None])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.rows(tokens).float() * self.scale[tokens]

    def rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """The int8 rows of ``tokens`` [..., d]: from the table, or gathered from the packed blocks."""
        if self.projection is None:
            return self.qweight[tokens]
        ids, d = tokens.reshape(-1), self.embedding_dim
        blocks = self.projection._packed.view(-1, d // 4, LANES, 4)
        return blocks[ids // LANES, :, ids % LANES, :].reshape(*tokens.shape, d)
