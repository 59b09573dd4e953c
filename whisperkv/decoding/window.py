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

A greedy window at temperature 0 of a float32 model (``rows.screened`` set) takes the rows before the
vocabulary instead: ``advance_screened(hidden, screened rows, row)`` chooses the full step's token from
the int8 screen (``decoding/screened.py``), and ``result`` adds up the deferred log-probabilities.

A greedy window at temperature 0 of a model with an int8 draft (``rows.guesses`` set) feeds k + 1 rows
of its cache when the draft guesses k tokens (``step_inputs``), and ``advance`` takes 1 to k + 1 tokens
from them (``decoding/speculative.py``): the same tokens as one row a step, in fewer steps.

Filters, search and ranking are ``decode.py``'s, applied to this window's rows only, so its tokens and
scores do not depend on which other windows share the step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from whisperkv.decoding.decode import cache_report, check_options, plan_decode
from whisperkv.decoding.greedy_choice import GreedyChoice, choose_next
from whisperkv.decoding.options import DecodingOptions, DecodingResult, compression_ratio
from whisperkv.decoding.screened import ScreenedGreedy, can_screen
from whisperkv.decoding.search import BeamSearch, GreedySearch, rank
from whisperkv.decoding.speculative import DraftGuesses
from whisperkv.errors import CacheReuseError
from whisperkv.model.draft import can_draft

if TYPE_CHECKING:
    from whisperkv.cache.kv import DecoderCache
    from whisperkv.cache.store import EncodedWindow
    from whisperkv.model.vocab_screen import ScreenedRows
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer


#: a screened window whose average log-probability is this close to ``exact_near`` is summed exactly
#: (the fast sum differs from the exact one by about 1e-6)
NEAR_THRESHOLD = 1e-3


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
        exact_near: float | None = None,
    ) -> None:
        """``exact_near``: a log-probability threshold the caller compares the result's
        ``avg_logprob`` with (fallback, silence); a screened window near it sums its log-probabilities
        with the full step's bits, so the decision is the full step's (``decoding/screened.py``)."""
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
        #: greedy at temperature 0 reads the int8 screen of the vocabulary (``advance_screened``)
        self.screened: ScreenedGreedy | None = None
        if options.temperature == 0 and not options.beam_size and can_screen(model.decoder, self.filters):
            self.screened = ScreenedGreedy(model.decoder, self.filters, tokenizer.eot)
        self._sum_before_screen: torch.Tensor | None = None
        #: greedy at temperature 0 with the model's int8 draft: its guesses and the one in flight
        self.guesses: DraftGuesses | None = None
        draft = getattr(model.decoder, "draft", None)
        greedy = options.temperature == 0 and not options.beam_size and self.screened is None
        if greedy and draft is not None and can_draft(model.decoder):
            self.guesses = DraftGuesses(draft, self.cache, self.filters, tokenizer.eot)
        self._guesses: list[int] = []  # the draft's guesses in the step in flight
        self.exact_near = exact_near
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
        """The (tokens [rows, 1], cache) groups this window feeds the next decoder step: its rows' last
        tokens; with a draft, also the draft's guesses of the tokens after them, as further positions
        of the same cache (``decoding/speculative.py``). Call once per step, before ``advance``."""
        groups = [(self.next_input(), self.cache)]
        self._guesses = []
        if self.guesses is not None:
            room = min(
                self.guesses.per_step,
                self.sample_len - self.steps - 1,  # tokens the budget still allows after the next one
                self.n_ctx - self.tokens.shape[-1],  # and the context
                self.n_ctx - self.cache.offset - 1,  # and the Self-KV
            )
            self._guesses = self.guesses.guess(self.tokens, room)
            groups += [(torch.tensor([[g]]), self.cache) for g in self._guesses]
        return groups

    @torch.no_grad()
    def advance(self, logits: torch.Tensor) -> None:
        """Take this window's next-token logits [rows, vocab]: filter, choose, follow beams. After the
        draft's k guesses, k + 1 rows: the step's token, then each next one while the guesses hold.

        The logits are the window's own (the step's fresh output): the filters edit them in place, not a
        copy (a copy of every row cost 15-40 µs a step)."""
        guesses, self._guesses = self._guesses, []
        self._advance(logits[:1] if guesses else logits)
        taken = 0
        for guess in guesses:
            if self.done or int(self.tokens[0, -1]) != guess:
                break
            taken += 1
            self._advance(logits[taken : taken + 1])
        if guesses:
            assert self.guesses is not None
            self.guesses.took(taken)
            if taken < len(guesses):  # positions of guesses not taken are not this window's
                self.cache.truncate(self.cache.offset - (len(guesses) - taken))

    def _advance(self, logits: torch.Tensor) -> None:
        self.tokens, completed, sources = choose_next(
            self.choice, self.filters, self.searcher, self.tokens, logits, self.sum_logprobs
        )
        if sources is not None:
            self.cache.reorder(sources.to(self.model.device))  # beams follow their parents' Self-KV
        self._stepped(completed)

    @torch.no_grad()
    def advance_screened(self, hidden: torch.Tensor, rows: ScreenedRows, row: int) -> None:
        """A greedy step from the screen: the row's hidden state [d] (after the final LayerNorm), and
        the screen's answer for the step's greedy rows, this one at ``row``. The token is the full
        step's; its log-probability is deferred to ``result``."""
        assert self.screened is not None
        if self._sum_before_screen is None:
            self._sum_before_screen = self.sum_logprobs.clone()
        token = self.screened.choose(hidden, rows, row, self.tokens)
        self.tokens = torch.cat([self.tokens, torch.tensor([[token]])], dim=-1)
        self._stepped(token == self.tokenizer.eot)

    def _stepped(self, completed: bool) -> None:
        """One more token for every row: done when all rows ended, the context is full, or the budget."""
        self.steps += 1
        if completed or self.tokens.shape[-1] > self.n_ctx or self.steps >= self.sample_len:
            self.done = True

    def _screened_sums(self) -> None:
        """The deferred log-probabilities of the screened steps, summed in step order."""
        if self.screened is None or self._sum_before_screen is None:
            return
        start, self._sum_before_screen = self._sum_before_screen, None
        self.sum_logprobs = self.screened.sum_logprobs(start, self.tokens)
        if self.exact_near is not None:
            row = self.tokens[0].tolist() + [self.tokenizer.eot]
            length = row.index(self.tokenizer.eot, self.sample_begin) - self.sample_begin
            if abs(float(self.sum_logprobs[0]) / (length + 1) - self.exact_near) < NEAR_THRESHOLD:
                self.sum_logprobs = self.screened.sum_logprobs(start, self.tokens, exact=True)

    def result(self) -> DecodingResult:
        """The best candidate, scored and ranked exactly as ``decode_window`` ranks it."""
        self._screened_sums()
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
        if self.guesses is not None:
            self.guesses.release()
