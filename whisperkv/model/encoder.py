"""AudioEncoder: log-Mel [B, n_mels, 3000] → audio features [B, 1500, d].

Two 1-D convolutions with GELU (the second with stride 2 halves 3,000 frames to 1,500 positions),
fixed sinusoidal positions, pre-LayerNorm transformer blocks with bidirectional self-attention, and a
final LayerNorm.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from whisperkv.model.attention import MultiHeadAttention


class BlockRunner(Protocol):
    """Another way to run an encoder block (a backend's, set at load: ``cpu/tiled_linear.py``)."""

    def forward(self, block: EncoderBlock, x: torch.Tensor) -> torch.Tensor: ...


class FrontRunner(Protocol):
    """Another way to run the convolutions and positions, for the windows it ``accepts``."""

    def accepts(self, mel: torch.Tensor) -> bool: ...

    def forward(self, encoder: AudioEncoder, mel: torch.Tensor) -> torch.Tensor: ...


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    """Whisper's fixed positional table: sin of geometric frequencies, then cos, per position."""
    assert channels % 2 == 0
    increment = math.log(max_timescale) / (channels // 2 - 1)
    # on the CPU even inside ``torch.device("meta")``: meta arithmetic imports sympy (+80 MB RSS)
    inv_timescales = torch.exp(-increment * torch.arange(channels // 2, device="cpu"))
    angles = torch.arange(length, device="cpu")[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


def mlp(n_state: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(n_state, 4 * n_state), nn.GELU(), nn.Linear(4 * n_state, n_state))


def gelu_in_place(x: torch.Tensor) -> torch.Tensor:
    """GELU of a tensor nothing else holds, in place when no gradient is recorded: the same numbers
    without a second activation as large (turbo's MLP: 30.7 MB a window)."""
    return F.gelu(x) if torch.is_grad_enabled() else torch.ops.aten.gelu_(x)


def add_residual(x: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """``x + branch``, written into ``branch`` (a layer's fresh output nothing else holds) when no gradient
    is recorded: the same numbers (addition is commutative) without a third activation whose pages are
    faulted afresh at every add (tiny.en's window 186.6 -> 180.8 ms int8, 333 -> 319 ms float32, scratch)."""
    if torch.is_grad_enabled() or branch.shape != x.shape or branch.dtype != x.dtype:
        return x + branch
    return branch.add_(x)


class EncoderBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int) -> None:
        super().__init__()
        self.attn_ln = nn.LayerNorm(n_state)
        self.attn = MultiHeadAttention(n_state, n_head)
        self.mlp_ln = nn.LayerNorm(n_state)
        self.mlp = mlp(n_state)
        #: a backend's way to run the block (the int8 type's AMX tiles), or None: PyTorch's, the twin
        self.tiles: BlockRunner | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tiles is not None:
            return self.tiles.forward(self, x)
        # the queries, keys and values (3 x 1,500 x d) are let go before the MLP, not held to the end
        x = add_residual(x, self.attn.attend(*self.attn.project_qkv(self.attn_ln(x))))
        fc1, gelu, fc2 = self.mlp
        if torch.is_grad_enabled() or type(gelu) is not nn.GELU or gelu.approximate != "none":
            return x + self.mlp(self.mlp_ln(x))
        return add_residual(x, fc2(gelu_in_place(fc1(self.mlp_ln(x)))))


class AudioEncoder(nn.Module):
    def __init__(self, n_mels: int, n_ctx: int, n_state: int, n_head: int, n_layer: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, n_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(n_state, n_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(n_ctx, n_state))
        self.blocks = nn.ModuleList(EncoderBlock(n_state, n_head) for _ in range(n_layer))
        self.ln_post = nn.LayerNorm(n_state)
        #: a backend's way to run the convolutions (the int8 type's AMX tiles), or None: PyTorch's
        self.front: FrontRunner | None = None

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        if self.front is not None and self.front.accepts(mel):
            x = self.front.forward(self, mel)
        else:
            x = self.convolutions(mel)
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)

    def convolutions(self, mel: torch.Tensor) -> torch.Tensor:
        """Log-Mel [B, n_mels, 3000] → [B, 1500, d]: the convolutions, GELUs and positions."""
        x = gelu_in_place(self.conv1(mel))
        x = gelu_in_place(self.conv2(x))
        x = x.transpose(1, 2)  # [B, positions, d]
        if x.shape[1:] != self.positional_embedding.shape:
            raise ValueError(
                f"encoder expects {2 * self.positional_embedding.shape[0]} Mel frames, "
                f"got {mel.shape[-1]} (pad or trim the window to 30 s)"
            )
        # the table first: the sum takes its contiguous layout, not the transposed one of x (which the
        # first LayerNorm then copied: 1.10 -> 0.54 ms for the two, scratch); the same numbers
        return self.positional_embedding.to(x.dtype) + x
