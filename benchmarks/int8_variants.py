"""Which of the int8 type's approximations costs word errors: the type, and the type with one part undone.

    PYTHONPATH=. .venv/bin/python benchmarks/int8_variants.py [--model base] [--threads 2]

The int8 type (``cpu/quantize.py``) approximates in several places at once. Each variant here undoes
one of them on the same float32 weights, and every variant transcribes the benchmark's utterances file
(built as ``bench.py`` builds it, 120 s) and its long file, greedy and beam 5, with the language given:

* ``int8``          — the type as loaded: int8 decoder linears and vocabulary, bfloat16 caches, and the
                      encoder this CPU gets (``cpu/quantize.py``'s ``encoder_choice``: bfloat16 with AMX,
                      int8 linears through the rows kernel with AVX512-VNNI, ...);
* ``int8-head-by-head`` — the encoder's attention head by head in PyTorch instead of the dot-product
                      kernel (``cpu/dot_attention.py``), where the int8 rows encoder runs;
* ``int8-sdpa-attention`` — the encoder's attention through float32 SDPA instead of the 16-bit integer
                      kernel (``cpu/int16_attention.py``), where the int8 type's fbgemm encoder runs (AVX2
                      without native bfloat16);
* ``float32-caches``— Self-KV and Cross-KV held in float32;
* ``bfloat16-encoder`` — the encoder in bfloat16;
* ``int8-rows-encoder`` — the encoder's linears in int8 through the rows kernel (each position's own scale);
* ``int8-tiles-encoder`` — the encoder's linears in int8 through AMX's int8 tiles (each position's own
                      scale, bfloat16 between them: ``cpu/int8_tiles.py``), where the CPU has AMX-INT8;
* ``int8-encoder``  — the encoder's linears in int8 through fbgemm (one scale a window);
* ``float32-vocab`` — the vocabulary projection in float32 (the table's int8 copy left unused);
* ``float32``       — no approximation: the reference's numbers.

Word errors are counted against the manifest's references (``whisperkv.metrics``). Seconds are printed
too, but this is a quality table: the variants run one after another, not interleaved.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import build_audio  # noqa: E402
from provenance import describe  # noqa: E402

import whisperkv  # noqa: E402
from whisperkv.cpu.head_by_head import HeadByHeadAttention  # noqa: E402
from whisperkv.cpu.plan import use_attention_kernels  # noqa: E402
from whisperkv.cpu.quantize import quantize_int8  # noqa: E402
from whisperkv.metrics import word_errors  # noqa: E402
from whisperkv.model.whisper import Whisper  # noqa: E402

VARIANTS = (
    "int8",
    "int8-head-by-head",
    "int8-sdpa-attention",
    "float32-caches",
    "bfloat16-encoder",
    "int8-rows-encoder",
    "int8-tiles-encoder",
    "int8-encoder",
    "float32-vocab",
)
VARIANTS += ("float32",)
#: the variants that choose the encoder, and the encoder they choose (``quantize_int8``'s ``encoder``)
ENCODERS = {"bfloat16-encoder": "bfloat16", "int8-rows-encoder": "int8 rows", "int8-encoder": "int8"}
ENCODERS["int8-tiles-encoder"] = "int8 tiles"


def load_variant(model: str, variant: str) -> Whisper:
    """The model with ``variant``'s approximations (see the module's docstring)."""
    loaded = whisperkv.load_model(model, compute_type="float32")
    if variant == "float32":
        return loaded
    projection = loaded.decoder.logits_projection  # the float32 table's projection, before quantising
    quantize_int8(loaded, encoder=ENCODERS.get(variant))
    if variant == "float32-caches":
        use_attention_kernels(loaded, True, bfloat16_caches=False)
    if variant == "float32-vocab":
        loaded.decoder.logits_projection = projection
    if variant == "int8-head-by-head":
        for block in loaded.encoder.blocks:
            block.attn.kernel = HeadByHeadAttention(from_float32=True)
    if variant == "int8-sdpa-attention":
        for block in loaded.encoder.blocks:
            block.attn.kernel = None
    return loaded


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="base")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(describe(args.threads))
    audios, refs = build_audio(min_utterance_seconds=120)
    print(
        f"\nmodel {args.model}; utterances {len(audios['utterances']) / 16000:.1f} s, long "
        f"{len(audios['long']) / 16000:.1f} s"
    )
    print(f"\n{'variant':<18} {'audio':<11} {'mode':<7} {'errors/words':>13} {'seconds':>8}")
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            print(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)}")
            return 2
        model = load_variant(args.model, variant)
        for audio in ("utterances", "long"):
            for beam in (None, 5):
                start = time.perf_counter()
                result = model.transcribe(audios[audio], beam_size=beam, best_of=5, language="en")
                seconds = time.perf_counter() - start
                errors, words = word_errors(refs[audio], result["text"])
                mode = "beam5" if beam else "greedy"
                cell = f"{errors}/{words}"
                print(f"{variant:<18} {audio:<11} {mode:<7} {cell:>13} {seconds:>8.1f}", flush=True)
        del model
    return 0


if __name__ == "__main__":
    sys.exit(main())
