"""The bfloat16 encoder's self-attention head by head: the int8 type's, where the CPU lacks AMX."""

from __future__ import annotations

import torch

from whisperkv.model.attention import heads


class HeadByHeadAttention:
    """The bfloat16 encoder's self-attention (the int8 type's, on a CPU with native bfloat16), one
    window and head at a time: two bfloat16 matrix products and a softmax over 1,500 x 1,500 scores.

    Why: SDPA took as long over bfloat16 as over float32 here (23 ms a layer, tiny.en); this takes the
    int8 type's encoder from 170-176 to 133-138 ms a window (``benchmarks/profile_step.py
    --compute_type int8``, with and without ``--sdpa``). The scores are rounded to bfloat16 before
    the softmax (SDPA keeps them in float32): the encoder output's mean distance to float32's grew by
    2 % (0.0110 against 0.0107 on a clip), its WER is measured (``benchmarks/bench.py``). One head's
    scores are 4.5 MB, so the whole 27 MB score matrix of a window is never held at once; a window's
    numbers do not depend on the others in its batch.

    Not where the CPU has AMX (``use_attention_kernels``): on round 14-15's Intel VM SDPA's bfloat16
    path took 7.3 ms a layer against 20.6 head by head (torch 2.13, 2 threads; scratch, round 15), the
    int8 type's encoder 62-73 against 85-117 ms a window, and its output was as close to float32's
    (mean distance 0.01168 against 0.01171 on jfk)."""

    def __init__(self, from_float32: bool = False) -> None:
        #: also take float32 queries, keys and values (the int8 type's encoder with int8 linears, whose
        #: outputs are float32): cast to bfloat16 here, the output cast back
        self.from_float32 = from_float32

    def accepts(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal_offset: int | None) -> bool:
        dtypes = (torch.bfloat16, torch.float32) if self.from_float32 else (torch.bfloat16,)
        return (
            causal_offset is None
            and q.dtype == k.dtype == v.dtype
            and q.dtype in dtypes
            and q.dim() == 3
            and q.shape[0] == k.shape[0]
            and q.shape[1] == k.shape[2] > 1
        )

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.dtype != torch.bfloat16:
            bf16 = torch.bfloat16
            return self(q.to(bf16), k.to(bf16), v.to(bf16)).to(q.dtype)
        b, t, d = q.shape
        n_head, width = k.shape[1], k.shape[3]
        queries = heads(q, n_head) * width**-0.5  # 1/8 for every Whisper model: exact in bfloat16
        out = q.new_empty(b, t, n_head, width)
        for i in range(b):
            for h in range(n_head):
                scores = torch.matmul(queries[i, h], k[i, h].transpose(0, 1))
                out[i, :, h] = torch.matmul(torch.softmax(scores, dim=-1), v[i, h])
        return out.reshape(b, t, d)
