"""Per-step breakdown of a greedy decoder step (and the encoder per window): the figures the README quotes.

    PYTHONPATH=. .venv/bin/python benchmarks/profile_step.py [--model tiny.en|base] [--compute_type int8]

The decoder is set up as in a real decode of ../shared's jfk clip (its encoder output and Cross-KV, a
Self-KV holding the prompt and ``--position`` tokens), then each part of one step is timed on its own,
interleaved with the others and repeated (``--repeats``), and the medians are printed: the vocabulary
projection under each layout ``cpu/vocab.py`` can choose, each layer's self-attention, cross-attention
and MLP, the whole step as ``TextDecoder.forward`` runs it, and the encoder per 30 s window. On a shared
machine the absolute figures move with the load; the machine line says what it was.
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


def median_ms(fn, repeats: int, inner: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times) * 1e3


def _encoder_against_its_twins(model, mel: torch.Tensor, repeats: int) -> dict[str, float] | None:
    """The int8 type's encoder per window as it runs (attention and linears in AMX tiles), with PyTorch's
    linears (round 18's), and with SDPA and PyTorch's linears (the tiles' twin, round 17's), alternated
    run by run (medians, ms); None where the encoder does not attend in tiles."""
    from whisperkv.cpu.plan import use_attention_kernels

    if type(model.encoder.blocks[0].attn.kernel).__name__ != "TiledEncoderAttention":
        return None
    ways = {"tiles": {}, "linears": {"linears": False}, "sdpa": {"tiles": False}}
    times: dict[str, list[float]] = {way: [] for way in ways}
    try:
        for _ in range(repeats):
            for way, options in ways.items():
                use_attention_kernels(model, **options)
                times[way].append(median_ms(lambda: model.embed_audio(mel[None]), 1, inner=1))
    finally:
        use_attention_kernels(model)
    return {way: statistics.median(t) for way, t in times.items()}


def _last_level_cache_mb() -> float | None:
    """The CPU's last-level cache in MB (Linux sysfs), or None where it does not say."""
    caches = sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"))
    sizes = []
    for size in caches:
        text = size.read_text().strip()
        units = {"K": 1e-3, "M": 1.0, "G": 1e3}
        if text and text[-1] in units and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * units[text[-1]])
    return max(sizes) if sizes else None


def _bandwidth_gb_s(mb: int = 400, repeats: int = 9) -> float:
    """Read speed of a buffer far larger than the caches (four times the last-level cache, at least
    ``mb``; the median of ``repeats`` sums), GB/s."""
    mb = max(mb, int(4 * (_last_level_cache_mb() or 0)))
    buffer = torch.ones(mb * 1_000_000 // 4)
    buffer.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        times.append(time.perf_counter() - start)
    return mb / 1e3 / statistics.median(times)


def parse_args() -> argparse.Namespace:
    """The profile's options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--compute_type", default="default")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--position", type=int, default=40, help="tokens already in the Self-KV")
    p.add_argument("--sdpa", action="store_true", help="PyTorch's SDPA everywhere, not the attention kernel")
    return p.parse_args()


def main() -> int:
    """Set a decoder up as in jfk's decode, time each part of one step and the encoder, print the table."""
    args = parse_args()
    torch.set_num_threads(args.threads)

    import whisperkv
    from whisperkv.audio import N_FRAMES, load_audio, log_mel_spectrogram, pad_or_trim
    from whisperkv.cpu.vocab import choose_layout, current_layout

    print(describe(args.threads))
    model = whisperkv.load_model(args.model, compute_type=args.compute_type)
    if args.sdpa:
        from whisperkv.cpu.plan import use_attention_kernels

        use_attention_kernels(model, on=False)
    decoder = model.decoder
    chosen = current_layout(decoder)
    # as held for the steps (float16 where exact), before the layouts below are tried; the int8 type's
    # embedding holds int8 rows (no ``weight``), and no byte count is printed for it
    table_bytes = decoder.token_embedding.weight.nbytes if model.compute_type != "int8" else 0
    mel = pad_or_trim(
        log_mel_spectrogram(load_audio(SPEECH / "en" / "jfk.flac"), model.dims.n_mels), N_FRAMES
    )
    with torch.no_grad():
        features = model.embed_audio(mel[None])
        cross = decoder.project_cross_kv(features, model.encoder_provenance(mel[None]))
        cache = decoder.new_cache(cross)
        decoder(torch.full((1, args.position), 50257), cache)  # a Self-KV holding `position` tokens
        held = cache.offset
        token = torch.tensor([[440]])
        beams = decoder.new_cache(cross, batch_size=5)  # a beam-5 window, as the engine steps it
        decoder(torch.full((5, args.position), 50257), beams)
        engine_step = _engine_step(decoder, held, cache, token)
        x = decoder._embed(token, held)
        parts = _whole_steps(
            model, decoder, cache, held, token, (beams, torch.full((5, 1), 440)), args.repeats
        )
        parts["embedding"] = median_ms(lambda: decoder._embed(token, held), args.repeats)
        parts.update(_layer_parts(decoder, cache, x, held, args.repeats))
        for kv in cache.self_kv:
            kv.length = held
        parts.update(_vocabulary_parts(model, x, chosen, args.repeats))
        encoder_ms = median_ms(lambda: model.embed_audio(mel[None]), max(3, args.repeats // 3), inner=1)
        encoder_twins = _encoder_against_its_twins(model, mel, max(3, args.repeats // 3))
        if encoder_twins is not None:
            encoder_ms = encoder_twins["tiles"]

    _, timings = choose_layout(model.dims.n_vocab, model.dims.n_text_state)
    attention = "SDPA" if model.decoder.attention_kernel is None else "the C kernel (decoder steps)"
    if model.decoder.blocks[0].step_rows is not None and model.compute_type == "int8":
        attention += "; linears: the int8 step kernels (PyTorch between the kernels where named)"
    elif model.decoder.blocks[0].step_rows is not None:
        attention += "; linears and vocabulary: the step rows kernel (the row GEMMs where named)"
    print(f"model: {args.model}, compute type {model.compute_type}; Self-KV holds {held} positions")
    print(f"attention: {attention}")
    print("load-time layout measurement (ms): " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in timings.items()))
    print(f"\n{'part of one greedy step':<48}{'median ms':>10}")
    layers = sum(v for k, v in parts.items() if k.startswith("layer "))
    for name, ms in parts.items():
        print(f"{name:<48}{ms:>10.3f}")
    print(f"{'sum of the layers':<48}{layers:>10.3f}")
    print(f"{'encoder per 30 s window':<48}{encoder_ms:>10.1f}")
    if encoder_twins is not None:
        print(f"{'  the same, linears by PyTorch (round 18)':<48}{encoder_twins['linears']:>10.1f}")
        print(f"{'  the same, SDPA and PyTorch (the tiles twin)':<48}{encoder_twins['sdpa']:>10.1f}")
    if model.compute_type == "int8":  # packed int8 weights are not parameters: no byte count here
        _int8_step_shares(decoder, engine_step, args.repeats)
        return 0
    _print_bytes_bound(decoder, cross, table_bytes)
    return 0


def _engine_step(decoder, held: int, cache, token: torch.Tensor):  # noqa: ANN001, ANN202
    """One step as the engine runs it (``forward_rows``), its Self-KV cut back to ``held`` first."""

    def engine_step(rows_cache=cache, tokens=token) -> None:  # noqa: ANN001
        for kv in rows_cache.self_kv:
            kv.length = held
        decoder.forward_rows([(tokens, rows_cache)])

    return engine_step


def _whole_steps(model, decoder, cache, held: int, token, beam_rows, repeats: int) -> dict[str, float]:  # noqa: ANN001
    """The whole step as ``TextDecoder.forward`` and as the engine run it, and beside each fast path its
    twin (the kernels called one by one; the row GEMMs or PyTorch glue)."""
    beams, beam_tokens = beam_rows
    engine_step = _engine_step(decoder, held, cache, token)

    def step() -> None:
        for kv in cache.self_kv:
            kv.length = held
        decoder(token, cache)

    parts: dict[str, float] = {}
    parts["whole step (TextDecoder.forward)"] = median_ms(step, repeats)
    parts["whole step, engine (forward_rows), 1 row"] = median_ms(engine_step, repeats)
    parts["whole step, engine, 5 beam rows"] = median_ms(lambda: engine_step(beams, beam_tokens), repeats)
    if decoder.blocks[0].block_step is not None:  # its twin, the kernels called one by one
        from whisperkv.cpu.block_step import use_block_step

        use_block_step(decoder, on=False)
        parts["whole step, engine, 1 row, call by call"] = median_ms(engine_step, repeats)
        parts["whole step, engine, 5 beam rows, call by call"] = median_ms(
            lambda: engine_step(beams, beam_tokens), repeats
        )
        use_block_step(decoder)
    if decoder.blocks[0].step_rows is not None:  # its twin: float32's row GEMMs (before round 11),
        from whisperkv.cpu.plan import use_attention_kernels  # int8's PyTorch (round 14)

        twin = "PyTorch glue" if model.compute_type == "int8" else "row GEMMs"
        use_attention_kernels(model, rows=False)
        parts[f"whole step, engine, 1 row, {twin}"] = median_ms(engine_step, repeats)
        parts[f"whole step, engine, 5 beam rows, {twin}"] = median_ms(
            lambda: engine_step(beams, beam_tokens), repeats
        )
        use_attention_kernels(model)
    return parts


def _layer_parts(decoder, cache, x: torch.Tensor, held: int, repeats: int) -> dict[str, float]:  # noqa: ANN001
    """Each layer's self-attention, cross-attention and MLP timed alone on the step's input."""
    parts: dict[str, float] = {}
    for i, (block, self_kv, kv) in enumerate(zip(decoder.blocks, cache.self_kv, cache.cross_kv)):

        def self_attention(block=block, self_kv=self_kv) -> torch.Tensor:  # noqa: ANN001
            self_kv.length = held
            q, k, v = block.attn.project_qkv(block.attn_ln(x))
            self_kv.append(k, v)
            return x + block.attn.attend(q, self_kv.key, self_kv.value, causal_offset=held)

        def cross_attention(block=block, kv=kv) -> torch.Tensor:  # noqa: ANN001
            return x + block.cross_attn(block.cross_attn_ln(x), kv.key, kv.value)

        parts[f"layer {i} self-attention"] = median_ms(self_attention, repeats)
        parts[f"layer {i} cross-attention"] = median_ms(cross_attention, repeats)
        parts[f"layer {i} MLP"] = median_ms(lambda block=block: x + block.mlp(block.mlp_ln(x)), repeats)
    return parts


def _vocabulary_parts(model, x: torch.Tensor, chosen: str, repeats: int) -> dict[str, float]:  # noqa: ANN001
    """The vocabulary projection in the layout in use and (not int8) in every layout ``cpu/vocab.py`` has."""
    from whisperkv.cpu.vocab import LAYOUTS, apply_layout

    decoder = model.decoder
    parts = {f"vocabulary projection ({chosen}, in use)": median_ms(lambda: decoder._logits(x), repeats)}
    if model.compute_type != "int8":
        for layout in LAYOUTS:
            apply_layout(decoder, layout)
            parts[f"vocabulary projection as {layout}"] = median_ms(lambda: decoder._logits(x), repeats)
        apply_layout(decoder, chosen)
    return parts


def _print_bytes_bound(decoder, cross, table_bytes: int) -> None:  # noqa: ANN001
    """The bytes one greedy step reads and the floor that memory bandwidth puts under its time."""
    # every block parameter as held (float16 where exact), but the cross-attention key/value projections:
    # they make a window's Cross-KV once, and a step reads the Cross-KV instead
    projected_once = {
        id(p)
        for b in decoder.blocks
        for layer in (b.cross_attn.key, b.cross_attn.value)
        for p in layer.parameters()
    }
    layer_bytes = sum(
        t.numel() * t.element_size() for t in decoder.blocks.parameters() if id(t) not in projected_once
    )
    layer_bytes += sum(kv.key.nbytes + kv.value.nbytes for kv in cross)
    step_bytes = layer_bytes + table_bytes
    bandwidth = _bandwidth_gb_s()
    print(
        f"\none greedy step reads {step_bytes / 1e6:.0f} MB (decoder weights, vocabulary table, Cross-KV); "
        f"memory read speed measured now {bandwidth:.1f} GB/s: a one-token step cannot take less than "
        f"{step_bytes / 1e6 / bandwidth:.2f} ms here"
    )
    cache_mb = _last_level_cache_mb()
    if cache_mb is not None and step_bytes / 1e6 < cache_mb:
        print(
            f"(the step's bytes fit in this CPU's {cache_mb:.0f} MB last-level cache: read from there, a "
            "step can take less than that)"
        )


def _int8_step_shares(decoder, engine_step, repeats: int) -> None:  # noqa: ANN001
    """Of the int8 type's engine step (1 row), the time inside its C calls (each timed around it: the
    one-call decoder step where it runs, else the blocks' one-call steps, the int8 rows kernel of the
    vocabulary and of any linear called alone, the attention kernel called alone), and the rest: PyTorch
    and Python between them, which the block step in C (round 15, ``cpu/int8_step.py``) and the one-call
    decoder step took away. Medians over the steps."""
    from whisperkv.cpu.attend import AttendKernel
    from whisperkv.cpu.block_step import BlockStep
    from whisperkv.cpu.int8_rows import Int8RowsKernel

    spent = {"one-call decoder step": 0.0, "block step kernel": 0.0, "int8 rows kernel": 0.0}
    spent["attention kernel"] = 0.0
    whole_step = getattr(decoder, "decoder_step", None)
    targets = [
        (Int8RowsKernel, "_run", "int8 rows kernel"),
        (AttendKernel, "__call__", "attention kernel"),
        (BlockStep, "__call__", "block step kernel"),
    ]
    if whole_step is not None:
        targets.append((type(whole_step), "logits", "one-call decoder step"))
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]

    def timed(fn, key: str):  # noqa: ANN001, ANN202
        def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - start

        return call

    rows: dict[str, list[float]] = {"whole": [], **{key: [] for key in spent}}
    for (owner, name, key), (_, _, fn) in zip(targets, originals):
        setattr(owner, name, timed(fn, key))
    try:
        with torch.no_grad():  # as the engine steps
            for n in range(10 + max(repeats, 50)):  # the first 10 warm up
                spent.update(dict.fromkeys(spent, 0.0))
                start = time.perf_counter()
                engine_step()
                whole = time.perf_counter() - start
                if n >= 10:
                    rows["whole"].append(whole)
                    for key, seconds in spent.items():
                        rows[key].append(seconds)
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
    rest = [w - sum(rows[key][n] for key in spent) for n, w in enumerate(rows["whole"])]
    print(f"\n{'the engine step (1 row), timed around its C calls':<48}{'median ms':>10}")
    for key in spent:
        print(f"{'  inside the ' + key:<48}{statistics.median(rows[key]) * 1e3:>10.3f}")
    print(f"{'  between them (PyTorch, Python)':<48}{statistics.median(rest) * 1e3:>10.3f}")
    print(f"{'  whole step':<48}{statistics.median(rows['whole']) * 1e3:>10.3f}")


if __name__ == "__main__":
    sys.exit(main())
