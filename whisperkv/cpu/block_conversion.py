"""A model converted part by part (a block at a time) into a compute type, holding little at once.

Why: the int8 and bfloat16 types are made from float16 weights (a float16 ``.pt`` or CTranslate2
directory) without first building the float32 model: each block is widened and converted in turn, and
after each the memory it freed goes back to the kernel (the heap's free middle, a memory-mapped
checkpoint's pages), so a load's peak holds the converted weights and one block, not the whole model
twice (``cpu/quantize.py``, ``cpu/bfloat16.py``; measured by ``benchmarks/load_memory.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from whisperkv.heap import give_back_free_memory


def widen_float16(module: nn.Module, linear_weights: bool = True) -> None:
    """Every float16 parameter and buffer below ``module`` as float32 (exactly), in place; bfloat16 ones
    (already converted) untouched. A float16 model becomes the int8 type a block at a time this way, so
    its load never holds every float32 weight at once (``load.py``).

    ``linear_weights=False``: the linear layers' weight matrices stay float16, for a conversion that reads
    them a few rows at a time (the int8 type's ``quantized_rows``): no float32 copy of a whole block
    (large-v3-turbo's decoder block: 105 MB)."""
    for sub in module.modules():
        skip = () if linear_weights or not isinstance(sub, nn.Linear) else ("weight",)
        for name, tensor in list(sub.named_parameters(recurse=False)):
            if tensor.dtype == torch.float16 and name not in skip:
                setattr(sub, name, nn.Parameter(tensor.detach().float(), requires_grad=False))
        for name, tensor in list(sub.named_buffers(recurse=False)):
            if tensor.dtype == torch.float16:
                persistent = name not in sub._non_persistent_buffers_set
                sub.register_buffer(name, tensor.float(), persistent=persistent)


def part_converted(release: Callable[[torch.Tensor | None], None] | None) -> None:
    """After a part is converted: the heap's free middle back to the kernel, and a mapped checkpoint's
    pages (``release(None)``, ``weights/mapped.py``)."""
    give_back_free_memory()
    if release is not None:
        release(None)
