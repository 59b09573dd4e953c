"""The int8 screen of the vocabulary (model/vocab_screen.py, ``load_model(vocab_screen=True)``) and the
greedy steps that read it (decoding/screened.py): its bound holds on real speech, its exact rows carry
the full product's bits, and a screened transcript is the full step's, token for token."""

from __future__ import annotations

import pytest
import torch

import whisperkv
import whisperkv.decoding.screened as screened_module
from whisperkv.engine import Scheduler
from whisperkv.model.attend_kernel import use_attention_kernels
from whisperkv.model.vocab import apply_layout

from .conftest import speech_audio as _audio

CLIPS = ["en/jfk.flac", "en/lj_LJ001-0007.flac", "en/timit_LDC93S1.wav"]
LONG = "long/lj001_0001-0032_concat.flac"


def _without_screen(model, audio, **options) -> dict:  # the full step: every logit, every step
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


def test_screen_is_opt_in_sound_and_follows_the_table(screened_model):
    from whisperkv.model.int8_rows import load_rows_kernel

    assert whisperkv.load_model("tiny.en").decoder.vocab_screen is None  # off by default
    if load_rows_kernel() is not None:  # multiplying through the rows kernel, in its layout only
        screen = screened_model.decoder.vocab_screen
        assert screen.kernel is not None and screen.qtable is None and screen.packed is not None
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
    assert decoder.logits_projection.kernel is decoder.blocks[0].step_rows  # the steps' kernel
    use_attention_kernels(screened_model)  # the table float16 again where the step rows kernel reads it
    assert decoder.vocab_screen.sound and decoder.vocab_screen.serves(decoder.token_embedding.weight)


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


def test_the_kernel_reports_the_quantised_rows_it_multiplied(screened_model):
    """With the int8 rows kernel (AVX512-VNNI), |h - ĥ| and |ĥ| are the kernel's own: its int8 logits
    equal ĥ · ŵ for the ĥ those norms describe (8 bits, a zero point), computed here in float64."""
    screen = screened_model.decoder.vocab_screen
    if screen.kernel is None:
        pytest.skip("no int8 rows kernel on this machine: the screen multiplies with torch._int_mm")
    hidden = torch.randn(3, screen.table.shape[1], generator=torch.Generator().manual_seed(4)) * 3
    rows = screen.approximate(hidden)
    assert rows.approx.shape == (3, screen.table.shape[0])
    ids = torch.arange(0, screen.table.shape[0], 997)
    qrows = (torch.round(screen.table[ids] / screen.scale[ids, None]).clamp(-127, 127)).double()
    for r in range(3):
        h = hidden[r].double()
        lo, hi = min(float(h.min()), 0.0), max(float(h.max()), 0.0)
        step = (hi - lo) / 255
        zero = round(-lo / step)
        quantised = ((torch.round(h / step) + zero).clamp(0, 255) - zero) * step
        assert rows.activation_error[r] == pytest.approx(float((h - quantised).norm()), rel=1e-3)
        assert rows.quantised_norm[r] == pytest.approx(float(quantised.norm()), rel=1e-4)
        expected = (qrows @ quantised) * screen.scale[ids].double()
        assert torch.allclose(rows.approx[r, ids].double(), expected, rtol=1e-5, atol=1e-4)


def test_the_int_mm_screen_is_sound_too(screened_model):
    """Without the rows kernel (no AVX512-VNNI) the screen multiplies with ``torch._int_mm``: its bound
    holds on the same real step rows, and the transcript is the full step's."""
    from whisperkv.model.vocab_screen import VocabScreen

    decoder = screened_model.decoder
    kernel_screen = decoder.vocab_screen
    plain = VocabScreen(decoder.token_embedding.weight, kernel=None)
    assert plain.kernel is None
    if not plain.sound:  # MKL gives gathered rows other bits on this CPU (seen on a Xeon with AMX)
        assert not plain.serves(decoder.token_embedding.weight)  # so the screen refuses to serve
        pytest.skip("gathered products differ from the full product's bits here: the screen refused")
    assert plain.serves(decoder.token_embedding.weight)
    hidden = []
    approximate = plain.approximate
    plain.approximate = lambda h: (hidden.append(h.clone()), approximate(h))[1]
    audio = _audio(CLIPS[0])
    full = _without_screen(screened_model, audio)
    decoder.vocab_screen = plain
    try:
        assert _tokens(screened_model.transcribe(audio)) == _tokens(full)
    finally:
        decoder.vocab_screen = kernel_screen
    assert len(hidden) > 20
    for h in hidden:
        rows = approximate(h)
        exact = screened_model.decoder.project(h, [1] * h.shape[0])
        for i in range(h.shape[0]):
            assert bool(((exact[i] - rows.approx[i]).abs() <= plain.bound(rows, i)).all())


def _plain_c_candidates(tmp_path):
    """``kernels/screen.c`` built here without AVX-512 (its scalar loops only), or None without a compiler."""
    import ctypes
    import shutil
    import subprocess

    from whisperkv.model.attend_kernel import SOURCES
    from whisperkv.model.vocab_screen import candidates_function

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source = next(s for s in SOURCES if s.name == "screen.c")
    built = tmp_path / "screen_plain.so"
    flags = ["-O3", "-ffast-math", "-fPIC", "-shared", "-mno-avx512f"]
    subprocess.run([compiler, *flags, str(source), "-o", str(built), "-lm"], check=True, timeout=120)
    return candidates_function(ctypes.CDLL(str(built)))


def test_candidates_from_the_kernel_are_pytorchs(screened_model, tmp_path, monkeypatch):
    """The library's two passes (``kernels/screen.c``), and the same file built without AVX-512, give
    the ids and floor the PyTorch passes give, on real step rows, with the masks of real filters,
    whole vocabulary and text tokens only."""
    import whisperkv.model.vocab_screen as vocab_screen_module

    screen = screened_model.decoder.vocab_screen
    if not screen.candidates_kernel:
        pytest.skip("the kernels' library is not built here")
    seen = []
    approximate = screen.approximate
    screen.approximate = lambda h: (seen.append(approximate(h)), seen[-1])[1]
    try:
        screened_model.transcribe(_audio(CLIPS[1]))
    finally:
        del screen.approximate
    assert len(seen) > 20
    n_vocab = screen.table.shape[0]
    ts = screened_model.tokenizer.timestamp_begin
    masks = [torch.zeros(n_vocab), torch.zeros(n_vocab), torch.full((n_vocab,), float("-inf"))]
    masks[1][[50256, 220, 1000, 50363]] = float("-inf")
    masks[1][ts + 10 :] = float("-inf")
    plain = _plain_c_candidates(tmp_path)
    versions = [vocab_screen_module._load_candidates()] + ([plain] if plain is not None else [])
    for rows, version in ((rows, version) for version in versions for rows in seen):
        monkeypatch.setattr(vocab_screen_module, "_load_candidates", lambda version=version: version)
        for mask in masks:
            for n in (n_vocab, ts):
                got = screen.candidates(rows, 0, mask, n, 2048)
                screen.candidates_kernel = False
                try:
                    want = screen.candidates(rows, 0, mask, n, 2048)
                finally:
                    screen.candidates_kernel = True
                assert got[1] == want[1]
                assert (got[0] is None) == (want[0] is None)
                if got[0] is not None:
                    assert torch.equal(got[0], want[0])
    assert screen.candidates(seen[0], 0, masks[2], n_vocab, 2048)[1] == float("-inf")
    assert screen.candidates(seen[0], 0, masks[0], n_vocab, 0)[0] is None  # too many for none allowed


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
