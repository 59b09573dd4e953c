"""Multi-head attention that reads keys/values from explicit tensors (or cache objects), never hooks.

One module serves the three uses in Whisper:
* encoder self-attention: queries, keys and values all from the same 1,500 positions;
* decoder masked self-attention: keys/values come from the ``SelfKV`` the caller appends to;
* decoder cross-attention: keys/values come from the ``CrossKV`` projected once per audio window.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)  # Whisper's key projection has no bias
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.key(x), self.value(x)

    def forward(
        self,
        x: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        causal_offset: int | None = None,
    ) -> torch.Tensor:
        """Attend the queries of ``x`` [B, Tq, d] over ``key``/``value`` [Bk, Tk, d].

        ``causal_offset``: when given, query i sits at position ``causal_offset + i`` and may only see
        keys at positions ≤ its own (decoder self-attention). When ``B`` is a multiple of ``Bk`` the
        rows are beams sharing one audio window: their queries are grouped, not the keys copied.
        """
        return self.out(attend(self.query(x), key, value, self.n_head, causal_offset))

    def weights(self, x: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """Softmax attention weights [B, H, Tq, Tk] (no mask): what word alignment reads."""
        q = _heads(self.query(x), self.n_head)
        k = _heads(_expand_rows(key, x.shape[0]), self.n_head)
        scale = q.shape[-1] ** -0.5
        return torch.softmax((q @ k.transpose(-1, -2)).float() * scale, dim=-1)


def _heads(x: torch.Tensor, n_head: int) -> torch.Tensor:
    b, t, d = x.shape
    return x.view(b, t, n_head, d // n_head).transpose(1, 2)


def _expand_rows(kv: torch.Tensor, rows: int) -> torch.Tensor:
    if kv.shape[0] == rows:
        return kv
    return kv.repeat_interleave(rows // kv.shape[0], dim=0)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_head: int, causal_offset: int | None = None
) -> torch.Tensor:
    """Scaled dot-product attention over heads; returns [B, Tq, d]."""
    b, tq, d = q.shape
    bk = k.shape[0]
    group = b // bk
    if group != 1:
        if b % bk or causal_offset is not None:
            raise ValueError(f"cannot attend {b} query rows over {bk} key rows")
        # Beams of one window: fold them into the query axis; cross-attention has no mask.
        q = q.reshape(bk, group * tq, d)
    mask = None
    if causal_offset is not None and tq > 1:
        positions = torch.arange(tq, device=q.device)[:, None] + causal_offset
        mask = torch.arange(k.shape[1], device=q.device)[None, :] <= positions
    out = F.scaled_dot_product_attention(
        _heads(q, n_head), _heads(k, n_head), _heads(v, n_head), attn_mask=mask
    )
    out = out.transpose(1, 2).reshape(bk, group * tq, d)
    return out.reshape(b, tq, d)
