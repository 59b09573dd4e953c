"""A decoder step in one C call against its twin (each block's one call, the final LayerNorm and the
projection from Python), whole transcriptions.

    PYTHONPATH=. .venv/bin/python benchmarks/decoder_step.py [--model base] [--compute_type int8]
        [--beam_size 5] [--pairs 6]

One process, one model, the long-form files of ../shared (temperature 0, as ``bench.py`` runs them):
each file transcribed with ``TextDecoder.decoder_step`` (``cpu/decoder_step.py``; the int8 type's:
``cpu/int8_decoder_step.py``) and without it, in
alternating order, pair after pair (``alternate.py``). Prints per way the median whole time, the median
decoder ms per step (``TextDecoder.forward_rows``: embedding, blocks, LayerNorm and vocabulary; the
token choice after it is not in it), and whether the transcripts' words are the same.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from alternate import StepTimer, alternate, setting  # noqa: E402
from provenance import describe  # noqa: E402

import whisperkv  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--model", default="tiny.en", choices=["tiny.en", "base"])
    p.add_argument("--compute_type", default="default", choices=["default", "int8", "bfloat16"])
    p.add_argument("--beam_size", type=int, default=None)
    p.add_argument("--pairs", type=int, default=6)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(describe(args.threads))
    model = whisperkv.load_model(args.model, compute_type=args.compute_type)
    decoder = model.decoder
    one_call = decoder.decoder_step
    if one_call is None:
        print("no C compiler found: the kernels cannot be built here")
        return 1
    timer = StepTimer()
    decoder.forward_rows = timer.wrap(decoder.forward_rows)  # this process only

    mode = f"beam {args.beam_size}" if args.beam_size else "greedy"
    what = f"model {args.model} ({args.compute_type}); {mode}, temperature 0"
    print(f"{what}; {args.pairs} pairs, order alternated")
    options = {"beam_size": args.beam_size} if args.beam_size else {}
    alternate(
        model,
        {
            "one call": setting(decoder, "decoder_step", one_call),
            "per block": setting(decoder, "decoder_step", None),
        },
        timer,
        args.pairs,
        "decoder ms/step",
        options,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
