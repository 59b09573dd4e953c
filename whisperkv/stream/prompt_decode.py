"""Greedy decoding of one window whose prompt state can be carried to the next decode of that window.

The prompt (``<|startofprev|>`` committed text, then ``<|startoftranscript|>`` ...) goes through the
decoder in one call that fills every layer's Self-KV and yields the two logit rows decoding reads from
it (no-speech at ``<|startoftranscript|>``, the first token at the prompt's end). Those depend only on
the prompt tokens, their positions and the Cross-KV attended to — recorded in ``SelfKVProvenance`` — so
when a later decode has the same three (a temperature-fallback retry, the same buffer decoded again) the
snapshot is exact and the prompt need not run again. The steps after the prompt are those of
``decode_windows`` for one greedy row (tests check the tokens are identical).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from whisperkv.cache.provenance import SelfKVProvenance
from whisperkv.cache.store import EncodedWindow
from whisperkv.decoding.decode import check_options, plan_decode
from whisperkv.decoding.greedy_choice import GreedyChoice, choose_next
from whisperkv.decoding.options import DecodingOptions, DecodingResult, compression_ratio
from whisperkv.decoding.search import GreedySearch

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer


@dataclass
class PromptState:
    """Every layer's Self-KV over the prompt positions, and the logits read from the prompt call."""

    provenance: SelfKVProvenance
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    logits: torch.Tensor  # [1, 2, vocab]: at <|startoftranscript|> and at the prompt's last token


def prompt_provenance(tokens: list[int], window: EncodedWindow) -> SelfKVProvenance:
    return SelfKVProvenance(tuple(tokens), 0, window.cross_kv[0].provenance)


@torch.no_grad()
def decode_greedy(
    model: Whisper,
    tokenizer: Tokenizer,
    window: EncodedWindow,
    options: DecodingOptions,
    reused: PromptState | None = None,
    generator: torch.Generator | None = None,
) -> tuple[DecodingResult, PromptState]:
    """Decode ``window`` greedily (or sampling at ``options.temperature``), one row.

    ``reused`` must already be checked against ``prompt_provenance`` by the caller (the reuse ledger);
    it is used as it is. Returns the result and the prompt state for a later decode.
    """
    check_options(options)
    if options.beam_size or options.best_of:
        raise ValueError("streaming decodes one greedy row: beam_size and best_of are not supported")
    n_ctx = model.dims.n_text_ctx
    prompt, sample_len, sample_begin, sot_index, filters = plan_decode(model, tokenizer, options)
    searcher = GreedySearch(options.temperature, tokenizer.eot, generator)
    choice = GreedyChoice.for_window(searcher, filters)  # as ``decode_windows`` chooses

    tokens = torch.tensor([prompt], device=model.device)
    cache = model.decoder.new_cache(window.cross_kv, batch_size=1)
    if reused is not None:
        for kv, key, value in zip(cache.self_kv, reused.keys, reused.values):
            kv.append(key, value)
        cache.record_tokens(tokens)
        logits, state = reused.logits, reused
    else:
        logits = model.decoder(tokens, cache, positions=[sot_index, sample_begin - 1])
        state = PromptState(
            prompt_provenance(prompt, window),
            [kv.key.clone() for kv in cache.self_kv],
            [kv.value.clone() for kv in cache.self_kv],
            logits.clone(),
        )
    no_speech_prob = float(logits[0, 0].softmax(dim=-1)[tokenizer.no_speech])
    sum_logprobs = torch.zeros(1)
    for _ in range(sample_len):
        logits = logits[:, -1].clone()
        tokens, completed, _ = choose_next(choice, filters, searcher, tokens, logits, sum_logprobs)
        if completed or tokens.shape[-1] > n_ctx:
            break
        # one row of one cache: the plan's whole step in one call where it has one (the same bits as
        # the block-by-block ``model.decoder``, tested; ``forward_rows`` falls back to those itself)
        logits = model.decoder.forward_rows([(tokens[:, -1:], cache)]).unsqueeze(1)

    row = tokens[0].tolist() + [tokenizer.eot]
    text_tokens = row[sample_begin : row.index(tokenizer.eot, sample_begin)]
    text = tokenizer.decode(text_tokens).strip()
    result = DecodingResult(
        audio_features=window.audio_features[0],
        language=tokenizer.language or "en",
        tokens=text_tokens,
        text=text,
        avg_logprob=float(sum_logprobs[0]) / (len(text_tokens) + 1),
        no_speech_prob=no_speech_prob,
        temperature=options.temperature,
        compression_ratio=compression_ratio(text),
    )
    return result, state
