"""The encoder's self-attention on this CPU: the int8 type's 16-bit integer kernel against SDPA.

    PYTHONPATH=. .venv/bin/python benchmarks/encoder_attention.py [--threads 2] [--repeats 7]

Two tables:

* one window's self-attention (1,500 positions, random queries, keys and values of unit scale) at
  tiny.en's 6 heads and large-v3-turbo's 20: float32 SDPA (what the float32 type and, without the
  kernel, the int8 type's float32 encoder run) and ``cpu/int16_attention.py`` (the int8 type's, on a CPU
  with AVX2 but no native bfloat16), interleaved, medians of wall ms, GFLOP/s (4 T^2 64 a head), and
  each one's mean distance to float64's answer over the values' mean size;
* tiny.en's float32 encoder (its float32 linears, so the attention alone differs) over the speech clips
  of ``../shared``: the mean distance of its output with the kernel in place of SDPA, over the output's
  mean size. The int8 type's words with the kernel are ``bench.py``'s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import describe  # noqa: E402

import whisperkv  # noqa: E402
from whisperkv.audio import log_mel_spectrogram, pad_or_trim  # noqa: E402
from whisperkv.cpu.attend import load_kernel  # noqa: E402
from whisperkv.cpu.int16_attention import Int16EncoderAttention  # noqa: E402
from whisperkv.model.attention import attend  # noqa: E402

POSITIONS, HEAD = 1500, 64
SPEECH = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "speech"
CLIPS = ("en/jfk.flac", "en/ls_1089-134686-0000.flac", "en/lj_LJ001-0007.flac", "en/lj_LJ001-0002.flac")


def _views(heads: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries [1, T, d] and keys/values [1, H, T, 64], views of one fused projection as the encoder's."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, POSITIONS, 3 * heads * HEAD, generator=g) * 2).chunk(3, dim=-1)
    split = (1, POSITIONS, heads, HEAD)
    return q, k.view(split).transpose(1, 2), v.view(split).transpose(1, 2)


def attention_table(kernel: Int16EncoderAttention, repeats: int) -> None:
    columns = ("SDPA float32 ms", "int16 kernel ms", "SDPA / kernel", "GFLOP/s SDPA, kernel")
    columns += ("error SDPA, kernel",)
    print("| heads | " + " | ".join(columns) + " |")
    print("|---|---|---|---|---|---|")
    for heads in (6, 20):
        qkv = _views(heads, heads)
        q, k, v = qkv
        calls = {"sdpa": lambda qkv=qkv: attend(*qkv), "int16": lambda qkv=qkv: kernel(*qkv)}
        times: dict[str, list[float]] = {name: [] for name in calls}
        for call in calls.values():
            call()
        for _ in range(repeats):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                times[name].append((time.perf_counter() - start) * 1e3)
        ms = {name: statistics.median(t) for name, t in times.items()}
        want = attend(q.double(), k.double(), v.double())
        size = v.abs().mean().item()
        error = {name: (call().double() - want).abs().mean().item() / size for name, call in calls.items()}
        flop = 4 * heads * POSITIONS**2 * HEAD / 1e6  # per ms: GFLOP/s
        print(
            f"| {heads} | {ms['sdpa']:.1f} | {ms['int16']:.1f} | {ms['sdpa'] / ms['int16']:.2f} | "
            f"{flop / ms['sdpa']:.0f}, {flop / ms['int16']:.0f} | {error['sdpa']:.1e}, {error['int16']:.1e} |"
        )


@torch.no_grad()
def speech_table(kernel: Int16EncoderAttention) -> None:
    model = whisperkv.load_model("tiny.en")  # float32: SDPA, the reference's attention
    print("\n| clip (tiny.en float32 encoder) | output distance, kernel for SDPA / output size |")
    print("|---|---|")
    for clip in CLIPS:
        mel = log_mel_spectrogram(pad_or_trim(whisperkv.load_audio(SPEECH / clip))).unsqueeze(0)
        reference = model.encoder(mel)
        for block in model.encoder.blocks:
            block.attn.kernel = kernel
        try:
            got = model.encoder(mel)
        finally:
            for block in model.encoder.blocks:
                block.attn.kernel = None
        print(f"| {clip} | {(got - reference).abs().mean() / reference.abs().mean():.1e} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(describe(args.threads))
    loaded = load_kernel()
    if loaded is None or not Int16EncoderAttention.available(loaded.library):
        sys.exit("the 16-bit attention kernel is not built here (no C compiler, or no AVX2 and FMA)")
    kernel = Int16EncoderAttention(loaded.library)
    attention_table(kernel, args.repeats)
    speech_table(kernel)


if __name__ == "__main__":
    main()
