"""A float32 prompt through the step rows kernel against PyTorch's linears (MKL), by prompt length.

    PYTHONPATH=. .venv/bin/python benchmarks/prompt_rows.py [--model tiny.en] [--repeats 15]

``CpuStepPlan.block`` sends a float32 prompt of ``PROMPT_POSITIONS`` or more through PyTorch's linears
and a shorter one through the rows kernel, a fixed rule (a prompt's numbers must not depend on a timing).
This prints, for prompts of several lengths over jfk's Cross-KV, the median ms of the whole prompt
(``TextDecoder.forward``, the vocabulary for its last position) each way, alternated, so the rule can be
checked on another CPU; and then a long-form transcript's prompt and step seconds with the rule as
committed and with every prompt through the kernel (``--file``; in one process, alternated).
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

SPEECH = Path(__file__).resolve().parents[2] / "shared" / "data" / "speech"
LENGTHS = (8, 16, 24, 32, 48, 64, 128, 225)
KERNEL_ONLY = 1 << 30  # PROMPT_POSITIONS no prompt reaches: every prompt through the kernel


def prompt_ms(model, cross, length: int, repeats: int) -> dict[str, float]:  # noqa: ANN001
    """Median ms of one prompt of ``length`` tokens through the kernel and through PyTorch, alternated."""
    import whisperkv.cpu.plan as plan

    decoder, kept = model.decoder, plan.PROMPT_POSITIONS
    tokens = torch.arange(1000, 1000 + length)[None]
    times: dict[str, list[float]] = {"kernel": [], "pytorch": []}
    try:
        for _ in range(repeats + 1):  # the first round pays one-off costs: dropped
            for way, threshold in (("kernel", KERNEL_ONLY), ("pytorch", 2)):
                plan.PROMPT_POSITIONS = threshold
                cache = decoder.new_cache(cross)
                start = time.perf_counter()
                decoder(tokens, cache, positions=[length - 1])
                times[way].append(time.perf_counter() - start)
    finally:
        plan.PROMPT_POSITIONS = kept
    return {way: statistics.median(t[1:]) * 1e3 for way, t in times.items()}


def long_form(model, path: Path, rounds: int) -> None:  # noqa: ANN001
    """A transcript of ``path`` with the committed rule and with every prompt through the kernel."""
    import whisperkv
    import whisperkv.cpu.plan as plan

    decoder, audio, kept = model.decoder, whisperkv.load_audio(path), plan.PROMPT_POSITIONS
    forward, spent = decoder.forward, [0.0]

    def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - a prompt (the engine steps by forward_rows)
        start = time.perf_counter()
        try:
            return forward(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    decoder.forward = timed
    results: dict[str, list[tuple[float, float]]] = {"committed rule": [], "every prompt kernel": []}
    try:
        for _ in range(rounds):
            for way, threshold in (("committed rule", kept), ("every prompt kernel", KERNEL_ONLY)):
                plan.PROMPT_POSITIONS, spent[0] = threshold, 0.0
                start = time.perf_counter()
                whisperkv.transcribe(model, audio, temperature=0.0)
                results[way].append((time.perf_counter() - start, spent[0]))
    finally:
        plan.PROMPT_POSITIONS = kept
        del decoder.forward
    print(f"\n{path.name}, {rounds} rounds alternated (medians): whole transcript s, its prompts s")
    for way, runs in results.items():
        whole, prompts = (statistics.median(r[i] for r in runs) for i in (0, 1))
        print(f"  {way:<22}{whole:>8.2f}{prompts:>8.2f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--file", default="long/lj001_0001-0032_concat.flac", help="under ../shared/data/speech")
    p.add_argument("--rounds", type=int, default=4, help="long-form rounds; 0 skips it")
    args = p.parse_args()

    import whisperkv
    from whisperkv.audio import N_FRAMES, load_audio, log_mel_spectrogram, pad_or_trim
    from whisperkv.cpu.plan import PROMPT_POSITIONS

    print(describe(torch.get_num_threads()))
    model = whisperkv.load_model(args.model)
    if "long prompts pytorch" not in model.weights_digest:
        print(f"the step rows kernel does not run here ({model.weights_digest}): nothing to compare")
        return 1
    mel = load_audio(SPEECH / "en" / "jfk.flac")
    mel = pad_or_trim(log_mel_spectrogram(mel, model.dims.n_mels), N_FRAMES)[None]
    with torch.no_grad():
        cross = model.decoder.project_cross_kv(model.embed_audio(mel), model.encoder_provenance(mel))
        print(f"model {args.model}; PROMPT_POSITIONS = {PROMPT_POSITIONS}\n")
        print(f"{'prompt tokens':>14}{'kernel ms':>12}{'pytorch ms':>12}{'ratio':>8}")
        for length in LENGTHS:
            ms = prompt_ms(model, cross, length, args.repeats)
            ratio = ms["pytorch"] / ms["kernel"]
            print(f"{length:>14}{ms['kernel']:>12.2f}{ms['pytorch']:>12.2f}{ratio:>8.2f}")
    if args.rounds:
        long_form(model, SPEECH / args.file, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
