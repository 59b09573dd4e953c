"""``whisperkv verify``: prove, on a real file, that every fast path gives the reference twin's tokens.

For each 30 s window of the file, decode with:
* ``twin``            — no cache at all: the whole prefix and the cross projections recomputed every step;
* ``cached``          — the normal path: Self-KV grown in place, Cross-KV projected once;
* ``fallback_reuse``  — the real temperature fallback (``decode_with_fallback``), forced to retry at
                        ``FALLBACK_TEMPERATURE`` with ``best_of`` samples on the window served from the
                        cache store (encoder output and Cross-KV reused), against the twin sampling at
                        that temperature from the same random-number state;
* ``alignment_reuse`` — the teacher-forced pass word timing runs, on the reused Cross-KV;
* ``language_reuse``  — (multilingual) language detection on the stored encoder output vs a fresh one.
* ``sealed_remote``   — (``--encoder_url``) the Cross-KV opened from a worker's sealed answer vs local.
Every path's tokens are compared step by step with the twin's, and its logits by max abs difference.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from whisperkv.audio import HOP_LENGTH, N_FRAMES, N_SAMPLES, load_audio, log_mel_spectrogram, pad_or_trim
from whisperkv.cache.store import CacheStore, WindowEncoder
from whisperkv.decoding.decode import decode_window, initial_tokens
from whisperkv.decoding.language import detect_language_from_features
from whisperkv.decoding.options import DecodingOptions, DecodingResult
from whisperkv.local_encoder import LocalEncoder
from whisperkv.transcribe import decode_with_fallback

if TYPE_CHECKING:
    from whisperkv.cache.store import EncodedWindow
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer

#: the retry temperature verify forces, and the samples drawn at it (one: the twin recomputes every
#: prefix at every step, for each sample; several samples per retry are checked against openai-whisper
#: by tests/test_parity.py)
FALLBACK_TEMPERATURE = 0.4
FALLBACK_BEST_OF = 1
#: the random-number state both sides of the fallback comparison start from
FALLBACK_SEED = 0


def compare(reference: DecodingResult, candidate: DecodingResult) -> dict:
    """Step-by-step token agreement and the largest logit difference while the prefixes agree."""
    assert reference.step_tokens is not None and candidate.step_tokens is not None
    assert reference.step_logits is not None and candidate.step_logits is not None
    first_diff = None
    max_diff = 0.0
    for step, (a, b) in enumerate(zip(reference.step_tokens, candidate.step_tokens)):
        la, lb = reference.step_logits[step], candidate.step_logits[step]
        if la.shape == lb.shape:
            max_diff = max(max_diff, float((la - lb).abs().max()))
        if a != b:
            first_diff = step
            break
    same_length = len(reference.step_tokens) == len(candidate.step_tokens)
    identical = first_diff is None and same_length and reference.tokens == candidate.tokens
    out = {"identical": identical, "tokens": len(candidate.tokens), "max_abs_logit_diff": max_diff}
    if first_diff is not None:
        logits = reference.step_logits[first_diff][0]
        top = logits.topk(2)
        out["first_divergent_step"] = first_diff
        out["reference_margin"] = float(top.values[0] - top.values[1])
    return out


def verify_fallback(
    model: Whisper, tokenizer: Tokenizer, window: EncodedWindow, options: DecodingOptions, store: CacheStore
) -> dict:
    """Force one temperature-fallback retry through the transcription's own fallback code, compare it
    with the twin sampling at the same temperature from the same random-number state.

    A log-probability threshold no result can reach makes the greedy (or beam) first try fail, so the
    retry at ``FALLBACK_TEMPERATURE`` runs on the stored encoder output and Cross-KV. The caller's
    random-number state is left as it was.
    """
    base = replace(options, best_of=FALLBACK_BEST_OF)
    retries_before = sum(hit.startswith("fallback retry") for hit in store.hits)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(FALLBACK_SEED)
        retried = decode_with_fallback(
            model, tokenizer, window, [0.0, FALLBACK_TEMPERATURE], base, None, float("inf"), None, store
        )
        torch.manual_seed(FALLBACK_SEED)  # the greedy first try drew nothing: the retry started here too
        twin_options = replace(
            base, temperature=FALLBACK_TEMPERATURE, beam_size=None, patience=None, use_cache=False
        )
        twin = decode_window(model, tokenizer, window.audio_features, twin_options)
    report = compare(twin, retried)
    retries = sum(hit.startswith("fallback retry") for hit in store.hits) - retries_before
    report["identical"] = report["identical"] and retried.temperature == FALLBACK_TEMPERATURE and retries == 1
    report["temperature"] = retried.temperature
    report["detail"] = (
        f"retry at temperature {retried.temperature} (best_of {FALLBACK_BEST_OF}, seed {FALLBACK_SEED}) "
        "vs the twin sampling from the same state"
    )
    return report


def verify_file(model: Whisper, path: str, beam_size: int | None = None, language: str | None = None) -> dict:
    audio = load_audio(path)
    mel = log_mel_spectrogram(audio, model.dims.n_mels, padding=N_SAMPLES)
    content_frames = mel.shape[-1] - N_FRAMES
    store = CacheStore(LocalEncoder(), max_entries=2)
    paths: dict[str, dict] = {}

    def merge(name: str, report: dict) -> None:
        have = paths.setdefault(name, {"identical": True, "tokens": 0, "max_abs_logit_diff": 0.0})
        have["identical"] = have["identical"] and report["identical"]
        have["tokens"] += report["tokens"]
        have["max_abs_logit_diff"] = max(have["max_abs_logit_diff"], report["max_abs_logit_diff"])
        for key in ("first_divergent_step", "reference_margin", "temperature", "detail"):
            if key in report and key not in have:
                have[key] = report[key]

    if model.is_multilingual and language is None:
        first = store.encode(model, pad_or_trim(mel, N_FRAMES), 0, N_SAMPLES, "language detection")
        language, probs = detect_language_from_features(model, first.audio_features)
        mel_window = pad_or_trim(mel, N_FRAMES).unsqueeze(0)  # the encoder takes a batch: [1, n_mels, 3000]
        fresh_language, fresh_probs = detect_language_from_features(model, model.embed_audio(mel_window))
        diff = max(abs(probs[k] - fresh_probs[k]) for k in probs)
        merge(
            "language_reuse",
            {"identical": language == fresh_language, "tokens": 1, "max_abs_logit_diff": diff},
        )
    tokenizer = model.tokenizer.with_options(language=language or "en")
    options = DecodingOptions(language=language or "en", beam_size=beam_size, record_logits=True)

    windows = 0
    twin_seconds = cached_seconds = 0.0
    for seek in range(0, max(content_frames, 1), N_FRAMES):
        size = min(N_FRAMES, content_frames - seek) if content_frames else N_FRAMES
        segment = pad_or_trim(mel[:, seek : seek + size], N_FRAMES)
        window = store.encode(model, segment, seek * HOP_LENGTH, (seek + size) * HOP_LENGTH, "verify")
        start = time.perf_counter()
        twin = decode_window(model, tokenizer, window.audio_features, replace(options, use_cache=False))
        twin_seconds += time.perf_counter() - start
        start = time.perf_counter()
        cached = decode_window(model, tokenizer, window.audio_features, options, cross_kv=window.cross_kv)
        cached_seconds += time.perf_counter() - start
        merge("cached", compare(twin, cached))

        again = store.encode(model, segment, seek * HOP_LENGTH, (seek + size) * HOP_LENGTH, "same window")
        report = verify_fallback(model, tokenizer, again, options, store)
        report["identical"] = report["identical"] and again is window
        merge("fallback_reuse", report)

        prompt = initial_tokens(tokenizer, options, model.dims.n_text_ctx, model.dims.n_text_ctx // 2)
        sequence = torch.tensor([[*prompt, *twin.tokens, tokenizer.eot]])
        with torch.no_grad():
            reference_logits = model.decoder.forward_uncached(sequence, window.audio_features)
            aligned_logits, _ = model.decoder.cross_attention_weights(sequence, window.cross_kv)
        same = bool((reference_logits.argmax(-1) == aligned_logits.argmax(-1)).all())
        merge(
            "alignment_reuse",
            {
                "identical": same,
                "tokens": sequence.shape[1],
                "max_abs_logit_diff": float((reference_logits - aligned_logits).abs().max()),
            },
        )
        windows += 1

    return {
        "file": str(path),
        "model": model.name or model.source,
        "beam_size": beam_size,
        "windows": windows,
        "identical": all(p["identical"] for p in paths.values()),
        "paths": paths,
        "seconds": {"twin": round(twin_seconds, 3), "cached": round(cached_seconds, 3)},
        "cache": store.report(),
    }


def add_remote_path(
    report: dict,
    model: Whisper,
    path: str,
    encoder: WindowEncoder,
    beam_size: int | None = None,
    language: str | None = None,
) -> dict:
    """Boundary (issue 11): the path ``sealed_remote`` — every window's Cross-KV opened from a worker's
    sealed answer against the one projected here (bit for bit), and the tokens decoded from each."""
    audio = load_audio(path)
    mel = log_mel_spectrogram(audio, model.dims.n_mels, padding=N_SAMPLES)
    content_frames = mel.shape[-1] - N_FRAMES
    language = language or report.get("language") or "en"
    tokenizer = model.tokenizer.with_options(language=language)
    options = DecodingOptions(language=language, beam_size=beam_size, record_logits=True)
    local_store, remote_store = CacheStore(LocalEncoder(), max_entries=1), CacheStore(encoder, max_entries=1)
    out = {"identical": True, "tokens": 0, "max_abs_logit_diff": 0.0, "max_abs_cross_kv_diff": 0.0}
    for seek in range(0, max(content_frames, 1), N_FRAMES):
        size = min(N_FRAMES, content_frames - seek) if content_frames else N_FRAMES
        segment = pad_or_trim(mel[:, seek : seek + size], N_FRAMES)
        bounds = (seek * HOP_LENGTH, (seek + size) * HOP_LENGTH)
        local = local_store.encode(model, segment, *bounds, "verify local")
        remote = remote_store.encode(model, segment, *bounds, "verify remote")
        for a, b in zip(local.cross_kv, remote.cross_kv):
            diff = max(float((a.key - b.key).abs().max()), float((a.value - b.value).abs().max()))
            out["max_abs_cross_kv_diff"] = max(out["max_abs_cross_kv_diff"], diff)
        here = decode_window(model, tokenizer, local.audio_features, options, cross_kv=local.cross_kv)
        there = decode_window(model, tokenizer, remote.audio_features, options, cross_kv=remote.cross_kv)
        result = compare(here, there)
        out["identical"] = out["identical"] and result["identical"] and out["max_abs_cross_kv_diff"] == 0.0
        out["tokens"] += result["tokens"]
        out["max_abs_logit_diff"] = max(out["max_abs_logit_diff"], result["max_abs_logit_diff"])
    out["detail"] = (
        f"carry={getattr(encoder, 'carry', '?')} max|ΔCross-KV|={out['max_abs_cross_kv_diff']:.3g}"
    )
    report["paths"]["sealed_remote"] = out
    report["identical"] = report["identical"] and out["identical"]
    return report
