"""int8 weights: dynamic quantisation of every linear layer, the tied logits projection included.

An approximation, unlike the other fast paths: weights are stored as int8 with one scale per output
row and activations are quantised on the fly, so logits move slightly. Its token agreement and WER
against float32 are measured by the benchmark, not assumed.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from whisperkv.model.whisper import Whisper


def quantize_int8(model: Whisper) -> Whisper:
    """Quantise ``model`` in place (CPU, float32 activations) and mark its provenance as int8."""
    if model.device.type != "cpu" or model.dtype != torch.float32:
        raise ValueError("int8 dynamic quantisation needs a float32 model on the CPU")
    base_digest = model.weights_digest  # of the float32 weights, before they are replaced
    weight = model.decoder.token_embedding.weight
    projection = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    projection.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao announces its future move; the kernels are current
        quantize = torch.ao.quantization.quantize_dynamic
        model.encoder.blocks = quantize(model.encoder.blocks, {nn.Linear}, dtype=torch.qint8)
        model.decoder.blocks = quantize(model.decoder.blocks, {nn.Linear}, dtype=torch.qint8)
        model.decoder.logits_projection = quantize(nn.Sequential(projection), {nn.Linear}, dtype=torch.qint8)
    model.__dict__["weights_digest"] = base_digest + "+int8"
    model.compute_type = "int8"
    return model
