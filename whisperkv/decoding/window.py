"""One window's decoding rows between decoder steps, so a scheduler can step many windows as one batch.

``decode_window`` runs its token loop to the end by itself. A ``WindowDecode`` is the same loop cut at
the decoder call: it owns the window's rows (the greedy row, ``beam_size`` beams or ``best_of``
samples), their tokens, scores, searcher and ``DecoderCache``; whoever runs the decoder feeds it the
logits of its rows, one step at a time:

    rows = WindowDecode(model, tokenizer, options, window, request_id, generator)
    rows.prefill()                           the prompt through the decoder (alone), first token chosen
    while not rows.done:
        logits = decoder.forward_rows([(rows.next_input(), rows.cache), ...other windows...])
        rows.advance(logits[my rows])        filters → greedy / sample / beam → Self-KV reorder
    result = rows.result()

Filters, search and ranking are ``decode.py``'s, applied to this window's rows only, so its tokens and
scores do not depend on which other windows share the step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from whisperkv.decoding.decode import cache_report, check_options, plan_decode
from whisperkv.decoding.greedy_choice import GreedyChoice, choose_next
from whisperkv.decoding.options import DecodingOptions, DecodingResult, compression_ratio
from whisperkv.decoding.search import BeamSearch, GreedySearch, rank
from whisperkv.errors import CacheReuseError

if TYPE_CHECKING:
    from whisperkv.cache.kv import DecoderCache
    from whisperkv.cache.store import EncodedWindow
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer


class WindowDecode:
    """The rows decoding one window at one temperature, for one request."""

    def __init__(
        self,
        model: Whisper,
        tokenizer: Tokenizer,
        options: DecodingOptions,
        window: EncodedWindow,
        request_id: str = "",
        generator: torch.Generator | None = None,
    ) -> None:
        check_options(options)
        for kv in window.cross_kv:  # a window encoded for another request is never decoded here
            owner = kv.provenance.encoder.request_id
            if owner != request_id:
                raise CacheReuseError("Cross-KV", "encoder.request_id", owner, request_id)
        self.model = model
        self.tokenizer = tokenizer
        self.options = options
        self.request_id = request_id
        self.n_ctx = model.dims.n_text_ctx
        prompt, self.sample_len, self.sample_begin, self.sot_index, self.filters = plan_decode(
            model, tokenizer, options
        )
        if options.temperature > 0:
            self.n_group = options.best_of or 1
            self.searcher: GreedySearch | BeamSearch = GreedySearch(
                options.temperature, tokenizer.eot, generator
            )
        elif options.beam_size:
            self.n_group = options.beam_size
            self.searcher = BeamSearch(options.beam_size, tokenizer.eot, options.patience)
        else:
            self.n_group = 1
            self.searcher = GreedySearch(0.0, tokenizer.eot)
        #: greedy at temperature 0: filters and choice in one pass (``decoding/greedy_choice.py``)
        self.choice = GreedyChoice.for_window(self.searcher, self.filters)
        self.tokens = torch.tensor([prompt] * self.n_group, device=model.device)
        # one row until the prompt is in: ``prefill`` copies it to every beam / sample row
        self.cache = model.decoder.new_cache(window.cross_kv, batch_size=1)
        self.sum_logprobs = torch.zeros(self.n_group)
        self.no_speech_prob = float("nan")
        self.steps = 0
        self.done = False

    @property
    def rows(self) -> int:
        return self.n_group

    @torch.no_grad()
    def prefill(self) -> None:
        """Run the prompt through the decoder, filling every layer's Self-KV, and choose the first token.

        The prompt needs logits at two places only: <|startoftranscript|> (the no-speech probability)
        and its last token (the first sampled token). Every row holds the same prompt, so it runs once
        and its Self-KV is copied to the other rows (a beam-5 window's prompt cost 5x for nothing).
        """
        logits = self.model.decoder(
            self.tokens[:1], self.cache, positions=[self.sot_index, self.sample_begin - 1]
        )
        if self.n_group > 1:
            self.cache.reorder(torch.zeros(self.n_group, dtype=torch.long, device=self.model.device))
        self.no_speech_prob = float(logits[0, 0].softmax(dim=-1)[self.tokenizer.no_speech])
        self.advance(logits[:, -1].expand(self.n_group, -1).clone())  # rows of their own: edited in place

    def next_input(self) -> torch.Tensor:
        """The token each row feeds the decoder next: [rows, 1]."""
        return self.tokens[:, -1:]

    @torch.no_grad()
    def step_inputs(self) -> list[tuple[torch.Tensor, DecoderCache]]:
        """The (tokens [rows, 1], cache) groups this window feeds the next decoder step."""
        return [(self.next_input(), self.cache)]

    @torch.no_grad()
    def advance(self, logits: torch.Tensor) -> None:
        """Take this window's next-token logits [rows, vocab]: filter, choose, follow beams.

        The logits are the window's own (the step's fresh output): the filters edit them in place, not a
        copy (a copy of every row cost 15-40 µs a step)."""
        self.tokens, completed, sources = choose_next(
            self.choice, self.filters, self.searcher, self.tokens, logits, self.sum_logprobs
        )
        if sources is not None:
            self.cache.reorder(sources.to(self.model.device))  # beams follow their parents' Self-KV
        self._stepped(completed)

    def _stepped(self, completed: bool) -> None:
        """One more token for every row: done when all rows ended, the context is full, or the budget."""
        self.steps += 1
        if completed or self.tokens.shape[-1] > self.n_ctx or self.steps >= self.sample_len:
            self.done = True

    def result(self) -> DecodingResult:
        """The best candidate, scored and ranked exactly as ``decode_window`` ranks it."""
        eot = self.tokenizer.eot
        candidates, scores = self.searcher.finalize(
            self.tokens.reshape(1, self.n_group, -1).cpu(), self.sum_logprobs.reshape(1, self.n_group)
        )
        texts = []
        for cand in candidates[0]:
            cand = cand.tolist() if isinstance(cand, torch.Tensor) else list(cand)
            texts.append(cand[self.sample_begin : cand.index(eot, self.sample_begin)])
        best = rank(texts, scores[0], self.options.length_penalty)
        best_tokens = texts[best]
        text = self.tokenizer.decode(best_tokens).strip()
        return DecodingResult(
            audio_features=None,
            language=self.tokenizer.language or "en",
            tokens=best_tokens,
            text=text,
            avg_logprob=scores[0][best] / (len(best_tokens) + 1),
            no_speech_prob=self.no_speech_prob,
            temperature=self.options.temperature,
            compression_ratio=compression_ratio(text),
            cache=cache_report(self.cache),
        )

    def release(self) -> None:
        """Free the rows' Self-KV now (the window is done or cancelled); the Cross-KV stays the job's."""
        self.cache = None  # type: ignore[assignment]
