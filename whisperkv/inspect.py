"""``whisperkv inspect``: a model's dimensions and what its two caches cost, measured on real objects.

The caches are built (Self-KV filled to ``text_positions``, Cross-KV at ``audio_positions``) and their
live byte counts read back; the closed form 2·B·L·T·d·s is printed beside them as a cross-check.
"""

from __future__ import annotations

import torch

from whisperkv.cache.kv import CrossKV, DecoderCache, SelfKV
from whisperkv.cache.provenance import CrossKVProvenance, EncoderProvenance
from whisperkv.model.dims import KNOWN_DIMS, ModelDims


def _dims_for(model: str) -> ModelDims:
    if model in KNOWN_DIMS:
        return KNOWN_DIMS[model]
    from whisperkv.weights import load_checkpoint

    return load_checkpoint(model).dims


def build_caches(
    dims: ModelDims, batch: int, text_positions: int, dtype: torch.dtype, audio_positions: int | None = None
) -> DecoderCache:
    """Allocate a DecoderCache of these dimensions and fill its Self-KV with ``text_positions``."""
    audio_positions = audio_positions or dims.n_audio_ctx
    d, h = dims.n_text_state, dims.n_text_head
    prov = EncoderProvenance("inspect", "inspect", 0, 0, f"n_mels={dims.n_mels}", str(dtype), "cpu")
    cross = [
        CrossKV(
            torch.zeros(batch, h, audio_positions, d // h, dtype=dtype),
            torch.zeros(batch, h, audio_positions, d // h, dtype=dtype),
            CrossKVProvenance(prov, layer),
        )
        for layer in range(dims.n_text_layer)
    ]
    selfs = [
        SelfKV(layer, batch, dims.n_text_ctx, d, dtype, "cpu", n_head=h) for layer in range(dims.n_text_layer)
    ]
    cache = DecoderCache(selfs, cross)
    step = torch.zeros(batch, h, text_positions, d // h, dtype=dtype)
    for kv in selfs:
        kv.append(step, step)
    return cache


def inspect_caches(
    model: str, batch: int, text_positions: int, dtype: str, audio_positions: int | None = None
) -> dict:
    dims = _dims_for(model)
    if not 0 <= text_positions <= dims.n_text_ctx:
        raise ValueError(f"text positions must be between 0 and {dims.n_text_ctx}")
    torch_dtype = getattr(torch, dtype)
    cache = build_caches(dims, batch, text_positions, torch_dtype, audio_positions)
    s = torch.tensor([], dtype=torch_dtype).element_size()
    layers = cache.layers()
    a = audio_positions or dims.n_audio_ctx
    return {
        "model": model,
        "dims": dims.to_dict(),
        "batch": batch,
        "dtype": dtype,
        "text_positions": text_positions,
        "audio_positions": a,
        "self_kv": [{"layer": x.layer, "shape": list(x.shape), "bytes": x.nbytes} for x in layers["self_kv"]],
        "cross_kv": [
            {"layer": x.layer, "shape": list(x.shape), "bytes": x.nbytes} for x in layers["cross_kv"]
        ],
        "self_kv_bytes": cache.self_kv_nbytes,
        "cross_kv_bytes": cache.cross_kv_nbytes,
        "total_bytes": cache.self_kv_nbytes + cache.cross_kv_nbytes,
        "formula": {
            "self_kv_bytes": 2 * batch * dims.n_text_layer * text_positions * dims.n_text_state * s,
            "cross_kv_bytes": 2 * batch * dims.n_text_layer * a * dims.n_text_state * s,
        },
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def render_inspect(r: dict) -> str:
    dims = r["dims"]
    lines = [
        f"model {r['model']}: " + ", ".join(f"{k}={v}" for k, v in dims.items()),
        f"batch={r['batch']} dtype={r['dtype']} text positions={r['text_positions']} "
        f"audio positions={r['audio_positions']}",
        "layer  Self-KV (K and V each)      bytes        Cross-KV (K and V each)     bytes",
    ]
    for s, c in zip(r["self_kv"], r["cross_kv"]):
        self_shape, cross_shape = str(tuple(s["shape"])), str(tuple(c["shape"]))
        row = f"{s['layer']:>5}  {self_shape:<26} {s['bytes']:>11,}  {cross_shape:<26} {c['bytes']:>11,}"
        lines.append(row)
    lines.append(f"total  Self-KV {r['self_kv_bytes']:,} B ({_mib(r['self_kv_bytes'])})")
    lines.append(f"       Cross-KV {r['cross_kv_bytes']:,} B ({_mib(r['cross_kv_bytes'])})")
    lines.append("       formula 2·B·L·T·d·s: " + ", ".join(f"{k}={v:,}" for k, v in r["formula"].items()))
    return "\n".join(lines)
