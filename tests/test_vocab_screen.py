"""The int8 screen of the vocabulary (model/vocab_screen.py, ``load_model(vocab_screen=True)``) and the
greedy steps that read it (decoding/screened.py): its bound holds on real speech, its exact rows carry
the full product's bits, and a screened transcript is the full step's, token for token."""

from __future__ import annotations

import pytest
import torch

import whisperkv
import whisperkv.decoding.screened as screened_module
from whisperkv.engine import Scheduler
from whisperkv.model.vocab import apply_layout

from .conftest import speech_audio as _audio

CLIPS = ["en/jfk.flac", "en/lj_LJ001-0007.flac", "en/timit_LDC93S1.wav"]
LONG = "long/lj001_0001-0032_concat.flac"


def _without_screen(model, audio, **options) -> dict:
    screen = model.decoder.vocab_screen
    model.decoder.vocab_screen = None
    try:
        return model.transcribe(audio, **options)
    finally:
        model.decoder.vocab_screen = screen


def _tokens(result: dict) -> list[list[int]]:
    return [s["tokens"] for s in result["segments"]]


@pytest.fixture(scope="module")
def screened_model():
    return whisperkv.load_model("tiny.en", vocab_screen=True)


def test_screen_is_opt_in_sound_and_follows_the_table(screened_model, tiny_model):
    assert tiny_model.decoder.vocab_screen is None  # off by default
    int8 = whisperkv.load_model("tiny.en", compute_type="int8", vocab_screen=True)
    assert int8.decoder.vocab_screen is None  # int8 logits are int8 already
    screen = screened_model.decoder.vocab_screen
    assert screen is not None and screen.sound
    assert screen.serves(screened_model.decoder.token_embedding.weight)
    assert not screen.serves(screened_model.decoder.token_embedding.weight.clone())  # another table
    decoder = screened_model.decoder
    apply_layout(decoder, "columns")  # another layout: no screen of the old table survives
    assert decoder.vocab_screen is None
    apply_layout(decoder, "rows-gemm", screen=True)
    assert decoder.vocab_screen.serves(decoder.token_embedding.weight)
    apply_layout(decoder, "rows-gemm")  # a screened decoder keeps a screen, of its table now
    assert decoder.vocab_screen is not None and decoder.vocab_screen is not screen
    assert decoder.vocab_screen.serves(decoder.token_embedding.weight)


def test_exact_rows_have_the_full_products_bits(screened_model):
    screen = screened_model.decoder.vocab_screen
    table = screened_model.decoder.token_embedding.weight
    hidden = torch.randn(table.shape[1], generator=torch.Generator().manual_seed(3)) * 20
    full = screened_model.decoder.project(hidden[None], [1])[0]  # the full step's product (rows-gemm)
    for n in (1, 3, 40, 600):
        ids = torch.randperm(table.shape[0], generator=torch.Generator().manual_seed(n))[:n].sort().values
        assert torch.equal(screen.exact(hidden, ids), full[ids])
    timestamp_begin = screened_model.tokenizer.timestamp_begin
    assert torch.equal(screen.exact_range(hidden, timestamp_begin, table.shape[0]), full[timestamp_begin:])


def test_bound_holds_for_every_logit_of_real_steps(screened_model, monkeypatch):
    """|float32 logit - int8 logit| <= bound for all 51,864 tokens of every greedy step of real speech,
    and the screen decides most steps by itself."""
    screen = screened_model.decoder.vocab_screen
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    approximate = screen.approximate

    def recording(hidden):
        rows = approximate(hidden)
        for i in range(hidden.shape[0]):
            bound = screen.bound(rows, i)
            seen.append((hidden[i : i + 1].clone(), rows.approx[i : i + 1].clone(), bound[None]))
        return rows

    monkeypatch.setattr(screen, "approximate", recording)
    for name in CLIPS[:2]:
        screened_model.transcribe(_audio(name))
    assert len(seen) > 40
    worst = 0.0
    for hidden, approx, bound in seen:
        exact = screened_model.decoder.project(hidden, [1] * hidden.shape[0])
        worst = max(worst, float(((exact - approx).abs() / bound).max()))
    assert worst < 1.0, f"the int8 logits strayed {worst:.2f}x the bound"


def test_screened_greedy_is_the_full_steps_transcript(screened_model, monkeypatch):
    """Same tokens with and without the screen (timestamps on and off, a prompt, 40 s long-form);
    the deferred log-probabilities agree to float rounding."""
    steps = {"all": 0, "full": 0}
    choose = screened_module.ScreenedGreedy.choose

    def counting(self, *args):
        before = self.fallbacks
        token = choose(self, *args)
        steps["all"] += 1
        steps["full"] += self.fallbacks - before
        return token

    monkeypatch.setattr(screened_module.ScreenedGreedy, "choose", counting)
    cases = [(_audio(name), {}) for name in CLIPS]
    cases += [
        (_audio(CLIPS[0]), {"without_timestamps": True}),
        (_audio(CLIPS[1]), {"initial_prompt": "Printing. Gutenberg."}),
        (_audio(LONG, 40), {}),  # two windows: the second one prompted with the first one's text
    ]
    for audio, options in cases:
        screened = screened_model.transcribe(audio, **options)
        full = _without_screen(screened_model, audio, **options)
        assert _tokens(screened) == _tokens(full)
        assert screened["text"] == full["text"]
        for a, b in zip(screened["segments"], full["segments"]):
            assert a["avg_logprob"] == pytest.approx(b["avg_logprob"], abs=1e-5)
    assert steps["all"] > 200
    assert steps["full"] <= steps["all"] // 5  # the screen, not the full product, decided most steps


def test_every_step_through_the_full_choice_changes_nothing(screened_model, monkeypatch):
    """With the screen unable to decide (no candidates allowed), each step takes the full product's
    filters and argmax inside the screened path: still the full transcript."""
    monkeypatch.setattr(screened_module, "MAX_CANDIDATES", 0)
    audio = _audio(CLIPS[0])
    assert _tokens(screened_model.transcribe(audio)) == _tokens(_without_screen(screened_model, audio))


def test_sum_near_a_threshold_is_the_full_steps_bit_for_bit(screened_model):
    """A window whose average log-probability lies near ``logprob_threshold`` is summed with the full
    step's chunk widths: the value — and the fallback decision on it — is the full step's exactly."""
    audio = _audio(CLIPS[0])
    full = _without_screen(screened_model, audio)
    threshold = full["segments"][0]["avg_logprob"]
    near = screened_model.transcribe(audio, logprob_threshold=threshold)
    assert _tokens(near) == _tokens(full)
    assert [s["avg_logprob"] for s in near["segments"]] == [s["avg_logprob"] for s in full["segments"]]


def test_screened_jobs_batched_equal_their_solo_runs(screened_model):
    """Greedy jobs screened together in one step (one int8 product for all their rows) beside a beam-5
    job: each result is its solo run's, bit for bit (avg_logprob included)."""
    jobs = [(_audio(CLIPS[0]), {}), (_audio(CLIPS[1]), {}), (_audio(CLIPS[2]), {"beam_size": 5})]
    solo = []
    for audio, options in jobs:
        torch.manual_seed(0)
        solo.append(screened_model.transcribe(audio, **options))
    scheduler = Scheduler(screened_model, max_batch=16)
    handles = []
    for audio, options in jobs:
        torch.manual_seed(0)
        handles.append(scheduler.submit(audio, options))
    widest = 0
    for _ in range(2000):  # bounded: three short clips take a few hundred ticks
        if all(h.done for h in handles):
            break
        scheduler.tick()
        widest = max(widest, scheduler.stats()["last_batch_rows"])
    assert widest == 7  # two greedy rows and five beams shared steps
    assert [h.result() for h in handles] == solo
