"""The two caches: growth, immutability, byte accounting, provenance, refusal, and the reference twin."""

from __future__ import annotations

import gc
import threading
import weakref
from dataclasses import replace

import pytest
import torch

import whisperkv
from whisperkv.audio import HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE, log_mel_spectrogram, pad_or_trim
from whisperkv.cache.store import CacheStore, check_reuse
from whisperkv.decoding.decode import decode_window
from whisperkv.decoding.options import DecodingOptions
from whisperkv.errors import CacheReuseError
from whisperkv.inspect import inspect_caches
from whisperkv.local_encoder import LocalEncoder
from whisperkv.model.decoder import TextDecoder
from whisperkv.verify import FALLBACK_BEST_OF, FALLBACK_TEMPERATURE, verify_file

from .conftest import SPEECH_DIR, clip_path, english_clips


def _window(model, audio, start_s: float, seconds: float = 30.0):
    mel = log_mel_spectrogram(audio, model.dims.n_mels, padding=N_SAMPLES)
    a, n = round(start_s * 100), round(seconds * 100)
    return pad_or_trim(mel[:, a : a + n], N_FRAMES), a * HOP_LENGTH, (a + n) * HOP_LENGTH


@pytest.fixture(scope="module")
def jfk(speech_dir):
    return whisperkv.load_audio(speech_dir / "en" / "jfk.flac")


@pytest.fixture(scope="module")
def long_audio(speech_dir):
    return whisperkv.load_audio(speech_dir / "long" / "lj001_0001-0032_concat.flac")


def test_inspect_builds_caches_with_the_documented_sizes():
    r = inspect_caches("tiny.en", batch=1, text_positions=100, dtype="float16")
    assert r["self_kv_bytes"] == 614400
    assert r["cross_kv_bytes"] == 9216000
    assert r["self_kv"][0]["shape"] == [1, 100, 384] and len(r["self_kv"]) == 4
    assert r["cross_kv"][3]["shape"] == [1, 1500, 384]
    assert r["formula"] == {"self_kv_bytes": 614400, "cross_kv_bytes": 9216000}
    big = inspect_caches("large-v3", batch=1, text_positions=448, dtype="float16")  # 0.3 GB, not 1.3
    assert big["self_kv_bytes"] == 2 * 1 * 32 * 448 * 1280 * 2


def test_self_kv_grows_one_position_per_token_and_cross_kv_never_changes(tiny_model, jfk):
    mel, start, end = _window(tiny_model, jfk, 0, 11)
    prov = tiny_model.encoder_provenance(mel[None], start, end)
    features = tiny_model.embed_audio(mel[None])
    cross = tiny_model.decoder.project_cross_kv(features, prov)
    snapshot = [(kv.key.clone(), kv.value.clone(), kv.key.data_ptr()) for kv in cross]
    cache = tiny_model.decoder.new_cache(cross)
    prompt = torch.tensor([[50257]])
    tiny_model.decoder(prompt, cache)
    lengths = [cache.offset]
    token = prompt
    for _ in range(5):
        logits = tiny_model.decoder(token, cache)
        token = logits[:, -1].argmax(-1, keepdim=True)
        lengths.append(cache.offset)
        assert all(kv.length == cache.offset for kv in cache.self_kv)
    assert lengths == [1, 2, 3, 4, 5, 6]
    for kv, (k, v, ptr) in zip(cache.cross_kv, snapshot):
        assert torch.equal(kv.key, k) and torch.equal(kv.value, v) and kv.key.data_ptr() == ptr
    # live bytes equal 2·B·L·T·d·s
    assert cache.self_kv_nbytes == 2 * 1 * 4 * 6 * 384 * 4
    assert cache.cross_kv_nbytes == 2 * 1 * 4 * 1500 * 384 * 4
    held = cache.self_kv[2].provenance()
    assert held.prefix[:1] == (50257,) and len(held.prefix) == 6 and held.start_position == 0
    assert held.cross_kv == cross[2].provenance and held.cross_kv.encoder.window_end == end


def test_beams_share_one_cross_kv_and_reorder_self_kv(tiny_model, jfk):
    mel, start, end = _window(tiny_model, jfk, 0, 11)
    features = tiny_model.embed_audio(mel[None])
    cross = tiny_model.decoder.project_cross_kv(
        features, tiny_model.encoder_provenance(mel[None], start, end)
    )
    cache = tiny_model.decoder.new_cache(cross, batch_size=5)
    assert cache.cross_kv[0].shape == (1, 1500, 384)  # not copied per beam
    tokens = torch.tensor([[50257, 50362]] * 5) + torch.tensor([[0, 0]] * 5)
    tiny_model.decoder(tokens, cache)
    tiny_model.decoder(torch.tensor([[1], [2], [3], [4], [5]]), cache)
    before = cache.self_kv[0].key.clone()
    cache.reorder(torch.tensor([4, 4, 0, 1, 2]))
    assert torch.equal(cache.self_kv[0].key[0], before[4]) and torch.equal(cache.self_kv[0].key[4], before[2])
    assert cache.tokens[:, -1].tolist() == [5, 5, 1, 2, 3]


def test_token_history_and_self_kv_peak_survive_dropped_rows_and_truncation(tiny_model, jfk):
    """The ids the Self-KV holds follow every write, reorder and drop (past its first capacity too), and
    the Self-KV's peak bytes are the most it ever held, though rows are dropped or a layer truncated."""
    mel, start, end = _window(tiny_model, jfk, 0, 11)
    features = tiny_model.embed_audio(mel[None])
    cross = tiny_model.decoder.project_cross_kv(
        features, tiny_model.encoder_provenance(mel[None], start, end)
    )

    def three_rows_written():
        cache = tiny_model.decoder.new_cache(cross, batch_size=3)
        tiny_model.decoder(torch.tensor([[50257, 50362]] * 3), cache)
        tiny_model.decoder(torch.tensor([[7], [8], [9]]), cache)
        return cache

    cache = three_rows_written()
    assert cache.tokens.tolist() == [[50257, 50362, 7], [50257, 50362, 8], [50257, 50362, 9]]
    with pytest.raises(ValueError, match="2 rows of tokens for a cache of 3 rows"):
        cache.record_tokens(torch.tensor([[1], [2]]))
    held = cache.self_kv_nbytes
    assert held == 2 * 3 * 3 * 384 * 4 * 4 and cache.peak_self_kv_nbytes == held
    cache.keep_rows(torch.tensor([2]), torch.tensor([0]))
    assert cache.tokens.tolist() == [[50257, 50362, 9]] and cache.batch_size == 1
    assert cache.self_kv_nbytes == held // 3 and cache.peak_self_kv_nbytes == held
    past = cache.self_kv[0].capacity + 5  # the history is first made that long: here it grows
    cache.record_tokens(torch.arange(past)[None])
    assert cache.tokens.tolist() == [[50257, 50362, 9, *range(past)]]

    cache = three_rows_written()
    for kv in cache.self_kv:
        kv.truncate(1)
    assert cache.self_kv_nbytes == held // 3 and cache.peak_self_kv_nbytes == held


@pytest.mark.parametrize(
    "beam_size, names",
    [
        pytest.param(None, ("lj_LJ001-0008.flac",), id="greedy"),
        pytest.param(5, ("lj_LJ001-0002.flac",), id="beam5"),
        pytest.param(
            None, ("jfk.flac", "ls_1089-134686-0000.flac"), id="greedy-longer-clips", marks=pytest.mark.slow
        ),
    ],
)
def test_cached_path_equals_reference_twin(tiny_model, speech_dir, beam_size, names):
    for name in names:
        report = verify_file(tiny_model, str(speech_dir / "en" / name), beam_size=beam_size)
        assert report["identical"], report
        assert set(report["paths"]) == {"cached", "fallback_reuse", "alignment_reuse"}
        assert report["paths"]["cached"]["max_abs_logit_diff"] < 1e-3
        # the fallback path really retried, sampling at the higher temperature, on the stored window
        assert report["paths"]["fallback_reuse"]["temperature"] == FALLBACK_TEMPERATURE
        hits = report["cache"]["hits"]
        assert any(h.startswith(f"fallback retry at temperature {FALLBACK_TEMPERATURE}") for h in hits), hits


def test_sampled_fallback_depends_on_the_random_state(tiny_model, jfk):
    """What makes verify's fallback comparison meaningful: at the retry temperature the same random state
    draws the same tokens and another state other tokens, so identical tokens mean the same draws."""
    mel, _, _ = _window(tiny_model, jfk, 0, 11)
    features = tiny_model.embed_audio(mel[None])
    options = DecodingOptions(
        language="en", temperature=FALLBACK_TEMPERATURE, best_of=FALLBACK_BEST_OF, sample_len=24
    )

    def sample(seed: int) -> list[int]:
        torch.manual_seed(seed)
        return decode_window(tiny_model, tiny_model.tokenizer, features, options).tokens

    first = sample(0)
    assert sample(0) == first
    assert any(sample(seed) != first for seed in range(1, 6))


def test_overlapping_windows_have_different_encoder_outputs(tiny_model, long_audio):
    """The seed's chunk fact: seconds 20-30 seen from window 0-30 and from window 20-50 differ."""
    a, _, _ = _window(tiny_model, long_audio, 0)
    b, _, _ = _window(tiny_model, long_audio, 20)
    fa, fb = tiny_model.embed_audio(a[None]), tiny_model.embed_audio(b[None])
    # encoder position p covers 20 ms; second 20 is position 1000 in window A and 0 in window B
    shared_a, shared_b = fa[0, 1000:1500], fb[0, 0:500]
    assert torch.equal(a[:, 2000:3000], b[:, 0:1000])  # the log-Mel input of the shared seconds is identical
    diff = float((shared_a - shared_b).abs().max())
    print(f"max |encoder(0-30 s)[20-30 s] - encoder(20-50 s)[20-30 s]| = {diff:.3f}")
    assert diff > 0.1


def test_store_refuses_an_overlapping_window_and_names_the_field(tiny_model, long_audio):
    store = CacheStore(LocalEncoder())
    a, a0, a1 = _window(tiny_model, long_audio, 0)
    b, b0, b1 = _window(tiny_model, long_audio, 20)
    window_a = store.encode(tiny_model, a, a0, a1)
    requested_b = tiny_model.encoder_provenance(b[None], b0, b1)
    with pytest.raises(CacheReuseError) as err:
        store.offer(window_a, requested_b)
    assert err.value.field == "mel_digest"
    assert store.refusals and "mel_digest" in store.refusals[0]
    # same content at another position is still another window
    moved = replace(window_a.provenance, window_start=a0 + 160, window_end=a1 + 160)
    with pytest.raises(CacheReuseError, match="window_start"):
        check_reuse("Cross-KV", window_a.provenance, moved)
    for field, value in [("weights_digest", "other-model"), ("dtype", "float16"), ("device", "cuda:0")]:
        with pytest.raises(CacheReuseError) as e:
            check_reuse("Cross-KV", window_a.provenance, replace(window_a.provenance, **{field: value}))
        assert e.value.field == field
    # the same window again is a hit, not a recomputation
    assert store.encode(tiny_model, a, a0, a1) is window_a and store.misses == 1


def test_self_kv_from_another_prefix_is_refused(tiny_model, jfk):
    mel, s, e = _window(tiny_model, jfk, 0, 11)
    features = tiny_model.embed_audio(mel[None])
    cross = tiny_model.decoder.project_cross_kv(features, tiny_model.encoder_provenance(mel[None], s, e))
    one, two = tiny_model.decoder.new_cache(cross), tiny_model.decoder.new_cache(cross)
    tiny_model.decoder(torch.tensor([[50257, 50362, 843]]), one)
    tiny_model.decoder(torch.tensor([[50257, 50362, 1002]]), two)
    with pytest.raises(CacheReuseError) as err:
        check_reuse("Self-KV", one.self_provenance(), two.self_provenance())
    assert err.value.field == "prefix"


def test_forced_invalid_reuse_diverges_and_unforced_is_refused(tiny_model, long_audio):
    """Decoding window 20-50 s with window 0-30 s's Cross-KV changes the result; the check stops it."""
    tokenizer = tiny_model.tokenizer
    options = DecodingOptions(language="en", record_logits=True, sample_len=40)
    a, a0, a1 = _window(tiny_model, long_audio, 0)
    b, b0, b1 = _window(tiny_model, long_audio, 20)
    store = CacheStore(LocalEncoder())
    wa, wb = store.encode(tiny_model, a, a0, a1), store.encode(tiny_model, b, b0, b1)
    correct = decode_window(tiny_model, tokenizer, wb.audio_features, options, cross_kv=wb.cross_kv)
    window_a_for_b = {"cross_kv": wa.cross_kv, "encoder_provenance": wb.provenance}
    with pytest.raises(CacheReuseError, match="mel_digest"):
        decode_window(tiny_model, tokenizer, wb.audio_features, options, **window_a_for_b)
    features_b = wb.audio_features
    forced = decode_window(tiny_model, tokenizer, features_b, options, **window_a_for_b, force_reuse=True)
    first_logit_diff = float((forced.step_logits[0] - correct.step_logits[0]).abs().max())
    print(
        f"forced reuse: first-step max |Δlogit| {first_logit_diff:.2f}; texts:"
        f"\n {correct.text}\n {forced.text}"
    )
    assert forced.tokens != correct.tokens
    assert first_logit_diff > 1.0


@pytest.mark.parametrize("n_threads", [3, pytest.param(8, marks=pytest.mark.slow)])
def test_concurrent_transcriptions_equal_their_solo_runs(tiny_model, n_threads):
    rows = english_clips(4.0)[:n_threads]
    if len(rows) < n_threads or not SPEECH_DIR.is_dir():
        pytest.skip("speech set not found")
    audios = [whisperkv.load_audio(clip_path(r)) for r in rows]
    solo = [tiny_model.transcribe(a, temperature=0.0)["text"] for a in audios]
    results: list[str | None] = [None] * len(audios)
    errors: list[BaseException] = []
    start = threading.Barrier(len(audios))

    def work(i: int) -> None:
        try:
            start.wait()
            results[i] = tiny_model.transcribe(audios[i], temperature=0.0)["text"]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(audios))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == solo


def test_transcribe_reports_cache_section(tiny_model, jfk):
    result = tiny_model.transcribe(jfk[: 5 * SAMPLE_RATE])
    cache = result["cache"]
    assert len(cache["self_kv"]) == 4 and len(cache["cross_kv"]) == 4
    t = cache["self_kv"][0]["shape"][1]
    assert cache["self_kv_bytes"] == 2 * 4 * t * 384 * 4
    assert cache["cross_kv_bytes"] == 2 * 4 * 1500 * 384 * 4
    assert cache["reuse"]["misses"] == 1 and cache["reuse"]["refusals"] == []


def _live(refs: list[weakref.ref]) -> list[str]:
    return [repr(r) for r in refs if r() is not None]


def test_a_windows_caches_die_with_it_without_the_garbage_collector(tiny_model, jfk, monkeypatch):
    """No reference cycle holds a cache: with the garbage collector off, reference counting alone must
    free a window's Self-KV when its decode returns, and every Cross-KV when the transcription returns."""
    self_refs: list[weakref.ref] = []
    cross_refs: list[weakref.ref] = []
    new_cache, project = TextDecoder.new_cache, TextDecoder.project_cross_kv

    def recording_new_cache(self, *args, **kwargs):
        cache = new_cache(self, *args, **kwargs)
        self_refs.append(weakref.ref(cache))
        self_refs.extend(weakref.ref(kv._key) for kv in cache.self_kv)
        return cache

    def recording_project(self, *args, **kwargs):
        cross = project(self, *args, **kwargs)
        cross_refs.extend(weakref.ref(t) for kv in cross for t in (kv, kv.key, kv.value))
        return cross

    monkeypatch.setattr(TextDecoder, "new_cache", recording_new_cache)
    monkeypatch.setattr(TextDecoder, "project_cross_kv", recording_project)
    mel, s, e = _window(tiny_model, jfk, 0, 11)
    gc.collect()
    gc.disable()
    try:
        features = tiny_model.embed_audio(mel[None])
        cross = tiny_model.decoder.project_cross_kv(features, tiny_model.encoder_provenance(mel[None], s, e))
        decode_window(tiny_model, tiny_model.tokenizer, features, DecodingOptions(language="en"), cross)
        assert len(self_refs) == 5 and not _live(self_refs), "a window's Self-KV outlived its decode"
        del cross
        assert not _live(cross_refs)

        result = tiny_model.transcribe(jfk, temperature=0.0)
        assert result["text"].strip() and len(self_refs) > 5 and len(cross_refs) > 12
        assert not _live(self_refs + cross_refs), "caches outlived the transcription"

        # the check can fail: a cache held in a reference cycle stays alive until the collector runs
        provenance = tiny_model.encoder_provenance(mel[None], s, e)
        cache = tiny_model.decoder.new_cache(tiny_model.decoder.project_cross_kv(features, provenance))
        cache.self_kv[0].back_reference = cache
        cycled = weakref.ref(cache)
        del cache
        assert cycled() is not None
    finally:
        gc.enable()
    gc.collect()
    assert cycled() is None


@pytest.mark.parametrize(
    "rows", [[0, 1, 2, 3, 4], [1, 0, 2, 3, 4], [0, 0, 0, 3, 3], [4, 3, 2, 1, 0], [2, 2, 2, 2, 2]]
)
def test_self_kv_reorder_in_place_equals_a_gather(rows):
    """Beam steps rewrite only the rows whose parent changed; the result is exactly a gather of the
    held positions, swaps and repeated parents included, and positions past the held ones are kept."""
    from whisperkv.cache.kv import SelfKV

    kv = SelfKV(0, 5, 16, 8, torch.float32, "cpu", n_head=2)
    kv.append(torch.randn(5, 2, 7, 4), torch.randn(5, 2, 7, 4))
    before_key, before_value = kv.key.clone(), kv.value.clone()
    index = torch.tensor(rows)
    kv.reorder(index)
    assert kv.length == 7
    assert torch.equal(kv.key, before_key.index_select(0, index))
    assert torch.equal(kv.value, before_value.index_select(0, index))
    kv.reorder(torch.zeros(3, dtype=torch.long))  # another row count: a fresh buffer, every row from 0
    assert kv.key.shape[0] == 3 and torch.equal(kv.key[2], before_key.index_select(0, index)[0])


def test_one_call_reorders_every_pattern_of_four_rows_as_a_gather():
    """Every parent pattern of four rows (256: chains, swaps, cycles, repeated parents) through the one-call
    reorder, whose copies are ordered to need scratch only for cycles: exactly a gather of the held
    positions, in both buffers of both layers."""
    import itertools

    from whisperkv.cache.kv import SelfKV, reorder_moves
    from whisperkv.cpu import reorder

    generator = torch.Generator().manual_seed(5)
    for parents in itertools.product(range(4), repeat=4):
        layers = [SelfKV(i, 4, 8, 8, torch.float32, "cpu", n_head=2) for i in range(2)]
        for kv in layers:
            kv.append(
                torch.randn(4, 2, 8, 4, generator=generator), torch.randn(4, 2, 8, 4, generator=generator)
            )
            kv.truncate(5)  # positions 5..7 hold values the reorder must not move
        before = [[b.clone() for b in kv.buffers] for kv in layers]
        rows = torch.tensor(parents)
        assert reorder.takes(layers, 4)
        reorder.reorder_layers(layers, reorder_moves(rows))
        for kv, old in zip(layers, before, strict=True):
            for buffer, held in zip(kv.buffers, old, strict=True):
                assert torch.equal(buffer[:, :, :5], held[:, :, :5].index_select(0, rows)), parents
                assert torch.equal(buffer[:, :, 5:], held[:, :, 5:]), parents


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_call_reorders_every_layer_as_the_twin_does(dtype):
    """A beam step's reorder of every layer in one C call (``cpu/reorder.py``, what
    ``DecoderCache.reorder`` calls): the keys and values the layer-by-layer twin leaves, bit for bit
    (swaps, repeated parents, rows that keep their own), and the positions past the held ones untouched."""
    from whisperkv.cache.kv import SelfKV, reorder_moves
    from whisperkv.cpu import reorder

    def layers() -> list[SelfKV]:
        generator = torch.Generator().manual_seed(3)
        made = [SelfKV(i, 6, 16, 8, dtype, "cpu", n_head=2) for i in range(3)]
        for kv in made:
            kv.append(*(torch.randn(6, 2, 16, 4, generator=generator).to(dtype) for _ in range(2)))
            kv.truncate(9)  # positions 9..15 hold values the reorder must not move
        return made

    rows = torch.tensor([1, 0, 0, 3, 5, 5])
    fast, twin, before = layers(), layers(), layers()
    assert reorder.takes(fast, 6) and not reorder.takes(fast, 5)
    reorder.reorder_layers(fast, reorder_moves(rows))
    for kv in twin:
        kv.reorder(rows)
    for a, b, old in zip(fast, twin, before, strict=True):
        assert a.length == b.length == 9
        assert all(torch.equal(x, y) for x, y in zip(a.buffers, b.buffers, strict=True))
        assert torch.equal(a.key, old.key.index_select(0, rows))
        assert torch.equal(a.buffers[0][:, :, 9:], old.buffers[0][:, :, 9:])
