"""How often a free draft would guess Whisper's next token: the case for (or against) speculative decoding.

    PYTHONPATH=. .venv/bin/python benchmarks/draft_acceptance.py [--seconds 240] [--model tiny.en]

Exact speculative decoding only pays when a draft token costs (almost) nothing and is often right. A
one-row decoder step already runs its GEMMs two columns wide (``model/row_gemm.py``), so one draft
token per step would ride along for the price of its attention; each accepted one saves a whole step.
The drafts with no model cost are n-grams of the text decoded so far, and the "Jacobi" guess the
padding row itself would make (run the previous step's second row on a guessed token; its prediction
is the next guess). This script transcribes each long file of ``../shared`` greedily and replays its
tokens, counting how often each n-gram draft would have been the model's own next token; then it runs
the two-row Jacobi loop on the first ``--clips`` short clips and counts tokens per step.
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


def jacobi_tokens_per_step(
    model, tokenizer, features: torch.Tensor, tokens: list[int]
) -> tuple[int, int, int]:
    """Replay a greedy decode as the two-row loop: each step feeds the last known token and a guess.

    A right guess yields two exact tokens (the second row's prediction is then the model's own); a wrong
    one yields one, and the second row's prediction (made after the wrong token) is the next guess.
    After a hit there is no model guess: the bigram of the text so far stands in. Predictions are raw
    argmaxes (no logit filters): an estimate of the rate, not a decode. Returns (tokens,
    steps, Jacobi guesses that hit).
    """
    prompt = list(tokenizer.sot_sequence_including_notimestamps)
    seq = prompt + tokens + [tokenizer.eot]
    decoder = model.decoder

    def predict(prefix: list[int]) -> int:
        return int(decoder.forward_uncached(torch.tensor([prefix]), features)[0, -1].argmax())

    known, guess, steps, hits = len(prompt), None, 0, 0
    after: dict[int, int] = {}
    while known < len(seq):
        steps += 1
        jacobi = guess is not None
        if guess is None:
            guess = after.get(seq[known - 1], seq[known - 1])
        second = predict(seq[:known] + [guess])
        if guess == seq[known]:
            hits += jacobi
            known = min(known + 2, len(seq))
            guess = None
        else:
            known += 1
            guess = second
        for i in range(len(prompt) + 1, known):
            after[seq[i - 1]] = seq[i]
    return len(seq) - len(prompt), steps, hits


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--seconds", type=float, default=240.0, help="seconds of each long file to transcribe")
    p.add_argument("--clips", type=int, default=8, help="short clips for the two-row Jacobi replay")
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

    from whisperkv.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim
    from whisperkv.decoding.decode import decode_window
    from whisperkv.decoding.options import DecodingOptions

    tokenizer = model.tokenizer.with_options(language="en")
    total = steps = hits = 0
    with torch.no_grad():
        for path in sorted((SPEECH / "en").glob("*.flac"))[: args.clips]:
            mel = log_mel_spectrogram(load_audio(str(path)), model.dims.n_mels)
            features = model.embed_audio(pad_or_trim(mel, N_FRAMES)[None])
            result = decode_window(model, tokenizer, features, DecodingOptions(language="en"))
            n, s, h = jacobi_tokens_per_step(model, tokenizer, features, result.tokens)
            total, steps, hits = total + n, steps + s, hits + h
    print(
        f"two-row Jacobi replay, {args.clips} clips of {SPEECH / 'en'}: {total} tokens in {steps} steps "
        f"({total / max(steps, 1):.2f} tokens a step); {hits} Jacobi guesses hit"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
