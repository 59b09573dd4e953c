"""The int8 type's encoder where the CPU has AVX512-VNNI but no AMX: int8 linears, bfloat16 the rest.

Why: a window's encoder is compute-bound (1,500 positions through every weight), and AVX512-VNNI makes
twice the products of AVX512-BF16 an instruction. On a 2-core AMD EPYC (Zen 4: VNNI and BF16, no AMX)
at large-v3-turbo's width, the rows kernel (``kernels/int8_rows.c``: each position quantised on its
own, as a decoder step's rows are) took 62 and 54 CPU ms for the MLP's two linears against 102 and 95
through PyTorch's bfloat16 (oneDNN), 1.6-1.8x (``benchmarks/encoder_int8.py``, CPU time, shared machine).

* ``Int8EncoderBlock``: each linear of a block with its LayerNorm, bias, GELU and residual in one C call
  (``Int8StepRows``, the decoder step's), the attention between them in bfloat16: through AVX512-BF16's
  dot product in C (``cpu/dot_attention.py``) where the library has it, else head by head
  (``cpu/head_by_head.py``). Twin: the block's PyTorch forward over the same ``Int8Linear``s (the same
  products; PyTorch's LayerNorm and GELU, whose last bits differ; head by head).
* ``Bfloat16Front``: the two convolutions and GELUs in bfloat16 (oneDNN's bfloat16 convolution took less
  than half the float32 one's time here), the positions added in float32. Twin: the float32 front.

An approximation, like the rest of the type: its distance to float32's encoder output is tested, its
words measured (``benchmarks/int8_variants.py``, ``benchmarks/bench.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from whisperkv.cpu.int8_step import Int8StepRows
from whisperkv.model.attention import heads

if TYPE_CHECKING:
    from whisperkv.model.encoder import AudioEncoder, EncoderBlock


class Int8EncoderBlock:
    """``EncoderBlock.forward`` with its four int8 linears through ``Int8StepRows``, each with what
    surrounds it (a ``BlockRunner``, ``model/encoder.py``)."""

    def __init__(self, rows: Int8StepRows) -> None:
        self.rows = rows

    @staticmethod
    def takes(block: EncoderBlock) -> bool:
        """Whether every linear of ``block`` is an ``Int8Linear`` held for the rows kernel."""
        layers = (block.attn.qkv, block.attn.out, block.mlp[0], block.mlp[2])
        return all(Int8StepRows.takes(layer) for layer in layers)

    def forward(self, block: EncoderBlock, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        flat = x.reshape(b * t, d).contiguous()
        attn, rows = block.attn, self.rows
        qkv = rows.through(flat, attn.qkv, norm=block.attn_ln).view(b, t, 3 * d)
        if attn.kernel is not None:  # a bfloat16 attention: rounded once, as one projection's layout
            qkv = qkv.to(torch.bfloat16)
        q, k, v = qkv[..., :d], heads(qkv[..., d : 2 * d], attn.n_head), heads(qkv[..., 2 * d :], attn.n_head)
        attended = attn.attention(q, k, v).reshape(b * t, d).float().contiguous()
        flat = rows.through(attended, attn.out, residual=flat)
        hidden = rows.through(flat, block.mlp[0], norm=block.mlp_ln, gelu=True)
        return rows.through(hidden, block.mlp[2], residual=flat).view(b, t, d)


class Bfloat16Front:
    """The encoder's convolutions and GELUs in bfloat16 over float32 log-Mel windows, float32 out (a
    ``FrontRunner``, ``model/encoder.py``); its own bfloat16 copies of the two convolutions' weights."""

    def __init__(self, encoder: AudioEncoder) -> None:
        self.mels = encoder.conv1.in_channels
        self.conv1 = [t.detach().to(torch.bfloat16) for t in (encoder.conv1.weight, encoder.conv1.bias)]
        self.conv2 = [t.detach().to(torch.bfloat16) for t in (encoder.conv2.weight, encoder.conv2.bias)]
        self.positions = encoder.positional_embedding

    def accepts(self, mel: torch.Tensor) -> bool:
        """float32 windows [B, mels, 2 x positions] (others go the twin's way, and its errors)."""
        shape = (self.mels, 2 * self.positions.shape[0])
        return mel.dtype == torch.float32 and mel.dim() == 3 and tuple(mel.shape[1:]) == shape

    def forward(self, encoder: AudioEncoder, mel: torch.Tensor) -> torch.Tensor:
        x = F.gelu(F.conv1d(mel.to(torch.bfloat16), *self.conv1, padding=1))
        x = F.gelu(F.conv1d(x, *self.conv2, stride=2, padding=1))
        return x.transpose(1, 2).float() + self.positions
