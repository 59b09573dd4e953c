"""Decode one 30 s window: prompt → token loop → ranked result.

The data path, top to bottom:
1. the encoder output (given, or computed from the Mel window) and its Cross-KV, projected once;
2. the prompt: [<|startofprev|> previous text] <|startoftranscript|> [lang] [task]
   [<|notimestamps|>] [prefix];
3. the prompt goes through the decoder in one call, filling every layer's Self-KV;
4. then one token per step: filter logits → choose (greedy / sample / beam) → feed only that token;
   beam search reorders each layer's Self-KV to follow the surviving beams;
5. candidates are ranked and the best becomes the result.

``options.use_cache=False`` runs the reference twin instead: no cache, the whole prefix recomputed
at every step. Both paths must produce the same tokens.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple

import torch

from whisperkv.cache.kv import CrossKV, DecoderCache
from whisperkv.cache.provenance import EncoderProvenance
from whisperkv.cache.store import check_reuse
from whisperkv.decoding.batch_rows import BatchRows
from whisperkv.decoding.greedy_choice import GreedyChoice, choose_next
from whisperkv.decoding.logit_filters import (
    LogitFilter,
    SuppressBlank,
    SuppressTokens,
    TimestampRules,
    hold_end_of_text,
)
from whisperkv.decoding.options import DecodingOptions, DecodingResult, compression_ratio
from whisperkv.decoding.search import BeamSearch, GreedySearch, rank

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer

SECONDS_PER_TIMESTAMP = 0.02


def check_options(options: DecodingOptions) -> None:
    if options.beam_size is not None and options.best_of is not None:
        raise ValueError("beam_size and best_of can't be given together")
    if options.temperature == 0 and options.best_of is not None:
        raise ValueError("best_of with greedy sampling (T=0) is not compatible")
    if options.patience is not None and options.beam_size is None:
        raise ValueError("patience requires beam_size to be given")
    if options.length_penalty is not None and not 0 <= options.length_penalty <= 1:
        raise ValueError("length_penalty (alpha) should be a value between 0 and 1")


def initial_tokens(tokenizer: Tokenizer, options: DecodingOptions, n_ctx: int, sample_len: int) -> list[int]:
    tokens = list(
        tokenizer.sot_sequence_including_notimestamps
        if options.without_timestamps
        else tokenizer.sot_sequence
    )
    if options.prefix:
        prefix = options.prefix
        prefix_tokens = tokenizer.encode(" " + prefix.strip()) if isinstance(prefix, str) else list(prefix)
        # keep the last (n_ctx/2 - sample_len) tokens; like the reference, a limit of 0 (the default
        # sample_len) keeps them all, since [-0:] is the whole list
        prefix_tokens = prefix_tokens[-(n_ctx // 2 - sample_len) :]
        tokens += prefix_tokens
    hotwords = options.hotwords if options.hotwords and not options.prefix else None
    if options.prompt or hotwords:
        # faster-whisper's order: <|startofprev|> hotwords, then the previous text, each capped at half
        # the text context less one
        previous: list[int] = []
        if hotwords:
            previous += tokenizer.encode(" " + hotwords.strip())[: n_ctx // 2 - 1]
        if options.prompt:
            prompt = options.prompt
            prompt_tokens = (
                tokenizer.encode(" " + prompt.strip()) if isinstance(prompt, str) else list(prompt)
            )
            previous += prompt_tokens[-(n_ctx // 2 - 1) :]
        tokens = [tokenizer.sot_prev] + previous + tokens
    return tokens


def suppress_ids(tokenizer: Tokenizer, suppress_tokens: str | list[int] | None) -> list[int]:
    if isinstance(suppress_tokens, str):
        ids = [int(t) for t in suppress_tokens.split(",") if t.strip()]
    else:
        ids = list(suppress_tokens or [])
    if -1 in ids:
        ids = [t for t in ids if t >= 0] + list(tokenizer.non_speech_tokens)
    ids += [tokenizer.transcribe, tokenizer.translate, tokenizer.sot, tokenizer.sot_prev, tokenizer.sot_lm]
    ids.append(tokenizer.no_speech)
    return sorted(set(ids))


def logit_filters(
    tokenizer: Tokenizer, options: DecodingOptions, sample_begin: int, n_audio_ctx: int
) -> list[LogitFilter]:
    filters: list[LogitFilter] = []
    if options.suppress_blank:
        filters.append(SuppressBlank(tokenizer.encode(" ") + [tokenizer.eot], sample_begin))
    if options.suppress_tokens:
        filters.append(SuppressTokens(suppress_ids(tokenizer, options.suppress_tokens)))
    if not options.without_timestamps:
        precision = 30.0 / n_audio_ctx
        max_index = None
        if options.max_initial_timestamp:
            max_index = round(options.max_initial_timestamp / precision)
        filters.append(
            TimestampRules(
                tokenizer.timestamp_begin, tokenizer.eot, tokenizer.no_timestamps, sample_begin, max_index
            )
        )
    return filters


class DecodePlan(NamedTuple):
    """What every decoding loop derives from its options before the first step. One place computes it, so
    the plain, batched (engine), streaming and explained loops cannot drift apart."""

    prompt: list[int]  # the tokens fed before sampling
    sample_len: int  # most tokens to sample
    sample_begin: int  # index of the first sampled token
    sot_index: int  # where <|startoftranscript|> sits (its logits give the no-speech probability)
    filters: list[LogitFilter]


def plan_decode(model: Whisper, tokenizer: Tokenizer, options: DecodingOptions) -> DecodePlan:
    n_ctx = model.dims.n_text_ctx
    sample_len = options.sample_len or n_ctx // 2
    prompt = initial_tokens(tokenizer, options, n_ctx, sample_len)
    sample_begin = len(prompt)
    filters = logit_filters(tokenizer, options, sample_begin, model.dims.n_audio_ctx)
    return DecodePlan(prompt, sample_len, sample_begin, prompt.index(tokenizer.sot), filters)


@torch.no_grad()
def decode_window(
    model: Whisper,
    tokenizer: Tokenizer,
    audio_features: torch.Tensor,
    options: DecodingOptions,
    cross_kv: list[CrossKV] | None = None,
    encoder_provenance: EncoderProvenance | None = None,
    generator: torch.Generator | None = None,
    force_reuse: bool = False,
) -> DecodingResult:
    """Decode one window's encoder output [1, 1500, d] into the best token sequence.

    ``cross_kv`` lets a caller that already projected this window's Cross-KV (a fallback retry,
    a second pass) reuse it. When ``encoder_provenance`` says which window is being decoded, an
    offered Cross-KV from any other window is refused with ``CacheReuseError``; ``force_reuse``
    skips that check and exists only to show, in tests, what an invalid reuse would do.
    """
    if cross_kv is not None and encoder_provenance is not None and not force_reuse:
        check_reuse("Cross-KV", cross_kv[0].provenance.encoder, encoder_provenance)
    if cross_kv is None and options.use_cache:
        audio_features = audio_features.to(model.device, model.dtype)
        if encoder_provenance is None:
            encoder_provenance = model.encoder_provenance(audio_features)
        cross_kv = model.decoder.project_cross_kv(audio_features, encoder_provenance)
    return decode_windows(model, tokenizer, audio_features[:1], options, cross_kv, generator)[0]


def _searcher(
    options: DecodingOptions, eot: int, generator: torch.Generator | None
) -> tuple[GreedySearch | BeamSearch, int]:
    """The search the options ask for, and how many rows (beams or samples) each window gets."""
    if options.temperature > 0:
        return GreedySearch(options.temperature, eot, generator), options.best_of or 1
    if options.beam_size:
        return BeamSearch(options.beam_size, eot, options.patience), options.beam_size
    return GreedySearch(0.0, eot), 1


def _next_logits(
    model: Whisper,
    cache: DecoderCache | None,
    new: torch.Tensor,
    rows: BatchRows,
    audio_features: torch.Tensor,
    step: int,
    plan: DecodePlan,
    n_group: int,
) -> torch.Tensor:
    """One step's logits. The cached path feeds what the decoder has not seen: the prompt once a window
    (logits at <|startoftranscript|> and its last token only; every row of a window then copies its
    Self-KV rather than recomputing it), then one token a row. The uncached twin recomputes every token."""
    positions = [plan.sot_index, plan.sample_begin - 1]
    if cache is None:
        logits = model.decoder.forward_uncached(rows.tokens, audio_features)
        return logits[:, positions] if step == 0 else logits
    logits = model.decoder(new, cache, positions=positions if step == 0 else None)
    if step == 0 and n_group > 1:
        copies = torch.arange(new.shape[0], device=model.device).repeat_interleave(n_group)
        cache.reorder(copies)
        logits = logits.index_select(0, copies)
    return logits


@torch.no_grad()
def decode_windows(
    model: Whisper,
    tokenizer: Tokenizer,
    audio_features: torch.Tensor,
    options: DecodingOptions,
    cross_kv: list[CrossKV] | None = None,
    generator: torch.Generator | None = None,
    drop_finished: bool = True,
    end_bounds: list[tuple[int, int]] | None = None,
) -> list[DecodingResult]:
    """Decode a batch of windows [n_audio, 1500, d] together: one decoder call per step for all.

    Each window gets ``n_group`` rows (beams or samples), window-major; the rows of one window share
    its Cross-KV row. ``cross_kv`` (one per layer, batch n_audio) is required on the cached path.

    ``drop_finished``: a window whose rows are done leaves the batch (its caches too), so the others'
    steps stop paying for it: a greedy window at its end of text, a beam window once it holds as many
    finished candidates as it keeps (``decoding/batch_rows.py``). False keeps every window to the last
    step, as the reference does; the tokens are the same.

    ``end_bounds``: per window, (floor, ceiling) timestamp indices for ``hold_end_of_text`` (batched mode).
    """
    check_options(options)
    plan = plan_decode(model, tokenizer, options)
    searcher, n_group = _searcher(options, tokenizer.eot, generator)
    choice = GreedyChoice.for_window(searcher, plan.filters)  # ``decoding/greedy_choice.py``
    n_audio = audio_features.shape[0]
    audio_features = audio_features.to(model.device, model.dtype)
    tokens = torch.tensor([plan.prompt] * (n_audio * n_group), device=model.device)
    cache: DecoderCache | None = None
    if options.use_cache:
        if cross_kv is None:
            raise ValueError("the cached path needs the windows' Cross-KV")
        cache = model.decoder.new_cache(cross_kv, batch_size=n_audio)  # beams copied after the prompt
        del cross_kv  # the cache holds it now; once rows finish, the full batch's copy can be freed

    records: tuple[list, list] | None = ([], []) if options.record_logits else None  # logits, tokens
    # a beam window leaves once its candidates are done (it keeps ``max_candidates``; a patience under 1
    # keeps fewer than its beams and tops up from the live ones at the end, so it stays to the end)
    compact = drop_finished and cache is not None and n_audio > 1 and records is None
    compact_beams = compact and isinstance(searcher, BeamSearch) and searcher.max_candidates >= n_group
    compact = compact and isinstance(searcher, GreedySearch) and n_group == 1
    bounds = torch.tensor(end_bounds).repeat_interleave(n_group, dim=0) if end_bounds is not None else None
    rows = BatchRows(tokens, torch.zeros(n_audio * n_group), torch.arange(n_audio), bounds)
    no_speech_probs = [float("nan")] * n_audio
    new = tokens[::n_group]  # what the decoder has not seen yet: the prompt (once a window), then a token
    for step in range(plan.sample_len):
        logits = _next_logits(model, cache, new, rows, audio_features, step, plan, n_group)
        if step == 0:
            no_speech_probs = logits[::n_group, 0].softmax(dim=-1)[:, tokenizer.no_speech].tolist()
        logits = logits[:, -1].contiguous()  # the decoder's fresh output, edited in place: not copied again
        if records is not None:
            records[0].append(logits.clone().cpu())
        if rows.bounds is not None:
            sampled = rows.tokens[:, plan.sample_begin :]
            hold_end_of_text(logits, sampled, rows.bounds, tokenizer.timestamp_begin, tokenizer.eot)
        step_choice = choose_next(choice, plan.filters, searcher, rows.tokens, logits, rows.sum_logprobs)
        rows.tokens, completed, sources = step_choice
        if records is not None:
            records[1].append(rows.tokens[:, -1].tolist())
        if sources is not None and cache is not None:
            cache.reorder(sources.to(model.device))  # beams follow their parents' Self-KV
        if completed or rows.tokens.shape[-1] > model.dims.n_text_ctx:
            break
        if compact:
            rows.drop_ended(cache, tokenizer.eot, model.device)
        if compact_beams:
            rows.drop_full_windows(searcher, cache, n_group, model.device)
        new = rows.tokens[:, -1:]

    tokens, sum_logprobs = rows.restored(searcher, n_audio, n_group, tokenizer.eot)
    ranked = searcher.finalize(
        tokens.reshape(n_audio, n_group, -1).cpu(), sum_logprobs.reshape(n_audio, n_group)
    )
    report = cache_report(cache) if cache is not None else None  # one cache for the whole batch
    step_logits, step_tokens = records if records is not None else (None, None)
    results = _results(tokenizer, options, audio_features, ranked, plan.sample_begin, no_speech_probs)
    for result in results:
        result.step_logits, result.step_tokens, result.cache = step_logits, step_tokens, report
    return results


def _results(
    tokenizer: Tokenizer,
    options: DecodingOptions,
    audio_features: torch.Tensor,
    ranked: tuple[list, list],
    sample_begin: int,
    no_speech_probs: list[float],
) -> list[DecodingResult]:
    """Each window's best candidate (``rank``, with the length penalty) as its result."""
    eot = tokenizer.eot
    results = []
    for a, (candidates, scores) in enumerate(zip(*ranked, strict=True)):
        texts = []
        for cand in candidates:
            cand = cand.tolist() if isinstance(cand, torch.Tensor) else list(cand)
            texts.append(cand[sample_begin : cand.index(eot, sample_begin)])
        best = rank(texts, scores, options.length_penalty)
        best_tokens = texts[best]
        text = tokenizer.decode(best_tokens).strip()
        results.append(
            DecodingResult(
                audio_features=audio_features[a],
                language=tokenizer.language or "en",
                tokens=best_tokens,
                text=text,
                avg_logprob=scores[best] / (len(best_tokens) + 1),
                no_speech_prob=no_speech_probs[a],
                temperature=options.temperature,
                compression_ratio=compression_ratio(text),
            )
        )
    return results


def cache_report(cache: DecoderCache) -> dict:
    layers = cache.layers()
    return {
        "self_kv": [{"layer": s.layer, "shape": list(s.shape), "bytes": s.nbytes} for s in layers["self_kv"]],
        "cross_kv": [
            {"layer": s.layer, "shape": list(s.shape), "bytes": s.nbytes} for s in layers["cross_kv"]
        ],
        "self_kv_bytes": cache.self_kv_nbytes,
        "self_kv_peak_bytes": cache.peak_self_kv_nbytes,
        "cross_kv_bytes": cache.cross_kv_nbytes,
    }


def decode(
    model: Whisper, mel: torch.Tensor, options: DecodingOptions | None = None, **kwargs
) -> DecodingResult | list[DecodingResult]:
    """openai-whisper-style entry point: decode one Mel window [n_mels, 3000] (or its features).

    A batch [B, n_mels, 3000] gives a list of B results, as the reference's ``decode`` does.
    """
    from whisperkv.decoding.language import detect_language_from_features

    options = replace(options or DecodingOptions(), **kwargs)
    if mel.ndim == 3 and mel.shape[0] > 1:
        return [decode(model, window, options) for window in mel]
    mel = mel if mel.ndim == 3 else mel.unsqueeze(0)
    if mel.shape[-2:] == (model.dims.n_audio_ctx, model.dims.n_audio_state):
        features = mel
    else:
        features = model.embed_audio(mel)
    tokenizer = model.tokenizer
    language_probs = None
    if model.is_multilingual and options.language is None:
        language, language_probs = detect_language_from_features(model, features)
        options = replace(options, language=language)
    tokenizer = tokenizer.with_options(language=options.language, task=options.task)
    result = decode_window(model, tokenizer, features, options)
    result.language_probs = language_probs
    return result
