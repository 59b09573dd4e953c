"""How often a free draft would guess Whisper's next token: the case for (or against) speculative decoding.

    PYTHONPATH=. .venv/bin/python benchmarks/draft_acceptance.py [--seconds 240] [--model tiny.en]

Exact speculative decoding only pays when a draft token costs (almost) nothing and is often right. A
one-row decoder step already runs its GEMMs two columns wide (``model/row_gemm.py``), so one draft
token per step would ride along for the price of its attention; each accepted one saves a whole step.
The drafts with no model cost are n-grams of the text decoded so far. This script transcribes each
long file of ``../shared`` greedily and replays its tokens, counting how often each draft would have
been the model's own next token.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech"


def acceptance(tokens: list[int]) -> dict[str, float]:
    """Share of positions where each n-gram draft (from earlier in the same text) equals the token."""
    after_one: dict[int, int] = {}
    after_two: dict[tuple[int, int], int] = {}
    hits = {"bigram": 0, "trigram, else bigram": 0}
    for i in range(1, len(tokens)):
        prev, token = tokens[i - 1], tokens[i]
        bigram = after_one.get(prev)
        hits["bigram"] += bigram == token
        key = (tokens[i - 2], prev) if i >= 2 else None
        trigram = after_two.get(key) if key else None
        hits["trigram, else bigram"] += (trigram if trigram is not None else bigram) == token
        after_one[prev] = token
        if key:
            after_two[key] = token
    n = max(1, len(tokens) - 1)
    return {name: count / n for name, count in hits.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--seconds", type=float, default=240.0, help="seconds of each long file to transcribe")
    args = p.parse_args()

    import whisperkv
    from whisperkv.audio import SAMPLE_RATE, load_audio

    torch.set_num_threads(min(2, torch.get_num_threads()))
    model = whisperkv.load_model(args.model)
    print(f"model {args.model}; greedy, temperature fallback as transcribe; drafts from the text so far")
    for path in sorted((SPEECH / "long").glob("*.flac")):
        audio = load_audio(str(path))[: int(args.seconds * SAMPLE_RATE)]
        result = model.transcribe(audio, language="en" if args.model.endswith(".en") else None)
        tokens = [t for s in result["segments"] for t in s["tokens"]]
        rates = ", ".join(f"{name} {rate:.1%}" for name, rate in acceptance(tokens).items())
        print(f"{path.name}: {len(audio) / SAMPLE_RATE:.0f} s, {len(tokens)} tokens; draft accepted: {rates}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
