"""One window's journey through the model, recorded with its real data.

The file is transcribed first (the real ``transcribe()``, word timestamps on), so the window shown is one
that transcription decoded: window K is the K-th distinct ``seek`` among its segments. That window is then
replayed step by step from the same log-Mel frames and the same prompt (the previous windows' text), with a
timer and a ruler on every stage: the encoder output and its provenance, the Cross-KV projected once, each
decoder step (token, probability, the top five alternatives, Self-KV bytes, beam reorders), and the
alignment heads' cross-attention behind word timestamps. At temperature 0 the replay must give exactly the
tokens transcription produced for that window; ``tokens_match`` says whether it did.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from whisperkv.audio import HOP_LENGTH, N_FRAMES, SAMPLE_RATE, load_audio, log_mel_spectrogram, pad_or_trim
from whisperkv.decoding.decode import logit_filters, plan_decode
from whisperkv.decoding.greedy_choice import GreedyChoice, choose_next
from whisperkv.decoding.options import DecodingOptions
from whisperkv.decoding.search import BeamSearch, GreedySearch, rank
from whisperkv.timing import alignment_matrix

if TYPE_CHECKING:
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer

TOP_K = 5


@dataclass
class Step:
    """One sampled position of the window's final token sequence."""

    position: int  # index in the decoder's token sequence (prompt included)
    token: int
    text: str
    probability: float  # of this token under the filtered distribution the search chose from
    top: list[tuple[int, str, float]]  # the five most probable tokens there
    kind: str  # "text", "timestamp" or "special"


@dataclass
class Trace:
    """Everything ``whisperkv explain`` shows, as plain numbers (``to_json`` drops the large arrays)."""

    file: str
    model: str
    weights_digest: str
    language: str
    beam_size: int | None
    n_samples: int
    window_index: int
    n_windows: int
    seek: int  # first log-Mel frame of the window
    content_frames: int  # frames of real audio in the window; the rest is padding
    temperature: float
    provenance: dict[str, Any]
    prompt: list[tuple[int, str]]  # the tokens fed before sampling, with their text
    steps: list[Step]
    result_tokens: list[int]  # what transcribe() produced for this window
    text: str  # that window's text, as transcribe() gave it (its segments' texts joined)
    segments: list[dict]  # that window's segments: start, end, text
    tokens_match: bool | None  # None: a sampled (temperature > 0) window cannot be replayed exactly
    avg_logprob: float  # of the replayed best sequence, as the decoder scores it
    self_kv_bytes: list[list[int]]  # per decoder call, per layer: bytes held after that call
    cross_kv_bytes: list[int]  # per layer: constant
    reorders: list[int]  # decoder calls after which beam search moved Self-KV rows
    timings_ms: dict[str, Any]
    words: list[dict]  # the window's words with timestamps, from transcribe()
    alignment_tokens: list[str]  # rows of the alignment matrix
    waveform: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    mel: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    features: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    alignment: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))

    @property
    def window_seconds(self) -> tuple[float, float]:
        start = self.seek * HOP_LENGTH / SAMPLE_RATE
        return start, start + self.content_frames * HOP_LENGTH / SAMPLE_RATE

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if not isinstance(v, np.ndarray)}
        out["steps"] = [s.__dict__ for s in self.steps]
        out["window_seconds"] = list(self.window_seconds)
        out["shapes"] = {"mel": list(self.mel.shape), "encoder_output": list(self.features.shape)}
        return out


def _kind(tokenizer: Tokenizer, token: int) -> str:
    if token >= tokenizer.timestamp_begin:
        return "timestamp"
    return "special" if token >= tokenizer.eot else "text"


def _text(tokenizer: Tokenizer, token: int) -> str:
    if token >= tokenizer.timestamp_begin:
        return f"<|{(token - tokenizer.timestamp_begin) * 0.02:.2f}|>"
    if token >= tokenizer.eot:
        return tokenizer.decode_with_timestamps([token])
    return tokenizer.decode([token])


def _window_prompt(segments: list[dict], seek: int) -> list[int]:
    """The previous text transcription fed to this window: tokens since the last prompt reset."""
    prompt: list[int] = []
    for segment in segments:
        if segment["seek"] >= seek:
            break
        prompt.extend(segment["tokens"])
        if segment["temperature"] > 0.5:  # transcribe() stops conditioning after a hot window
            prompt = []
    return prompt


def _chosen_window(result: dict, window: int, path: str) -> tuple[list[int], int, list[dict]]:
    """The decoded windows' seeks, the ``window``-th one's seek and its segments; a clear error for a
    file with no decoded window or a window it does not have."""
    seeks = sorted({s["seek"] for s in result["segments"]})
    if not seeks:
        raise ValueError(f"{path}: transcription decoded no window (silence?): nothing to explain")
    if not 0 <= window < len(seeks):
        raise ValueError(
            f"--window {window}: {path} has {len(seeks)} decoded window(s), 0 to {len(seeks) - 1}"
        )
    seek = seeks[window]
    return seeks, seek, [s for s in result["segments"] if s["seek"] == seek]


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 3)


@torch.no_grad()
def trace_window(
    model: Whisper, path: str, window: int = 0, language: str | None = None, beam_size: int | None = None
) -> Trace:
    """Transcribe ``path``, then replay its ``window``-th decoded window with every stage recorded."""
    audio = load_audio(path)
    t0 = time.perf_counter()
    mel_all = log_mel_spectrogram(audio, model.dims.n_mels, padding=N_FRAMES * HOP_LENGTH)
    log_mel_ms = _ms(t0)
    result = model.transcribe(
        audio, language=language, beam_size=beam_size, word_timestamps=True, verbose=None
    )
    seeks, seek, segments = _chosen_window(result, window, path)
    content = mel_all.shape[-1] - N_FRAMES
    size = min(N_FRAMES, content - seek)
    mel = pad_or_trim(mel_all[:, seek : seek + size], N_FRAMES).to(model.device, model.dtype)[None]

    t0 = time.perf_counter()
    features = model.embed_audio(mel)
    encoder_ms = _ms(t0)
    provenance = model.encoder_provenance(mel, seek * HOP_LENGTH, (seek + size) * HOP_LENGTH)
    t0 = time.perf_counter()
    cross_kv = model.decoder.project_cross_kv(features, provenance)
    cross_kv_ms = _ms(t0)

    tokenizer = model.tokenizer.with_options(language=result["language"], task="transcribe")
    temperature = float(segments[0]["temperature"])
    options = DecodingOptions(
        language=result["language"],
        beam_size=beam_size if temperature == 0 else None,
        prompt=_window_prompt(result["segments"], seek),
    )
    replay = _replay(model, tokenizer, cross_kv, options)
    result_tokens = [t for s in segments for t in s["tokens"]]
    sampled = replay["tokens"]
    steps = _steps(model, tokenizer, cross_kv, options, replay["prompt"], sampled)
    text_tokens = [t for t in sampled if t < tokenizer.eot]
    matrix, _ = alignment_matrix(model, tokenizer, text_tokens, size, cross_kv=cross_kv)
    words = [w for s in segments for w in s.get("words", [])]
    return Trace(
        file=str(path),
        model=model.name or "model",
        weights_digest=model.weights_digest,
        language=result["language"],
        beam_size=beam_size,
        n_samples=len(audio),
        window_index=window,
        n_windows=len(seeks),
        seek=seek,
        content_frames=size,
        temperature=temperature,
        provenance={k: v for k, v in provenance.__dict__.items()},
        prompt=[(t, _text(tokenizer, t)) for t in replay["prompt"]],
        steps=steps,
        result_tokens=result_tokens,
        text="".join(s["text"] for s in segments),
        segments=[{k: s[k] for k in ("start", "end", "text")} for s in segments],
        tokens_match=None if temperature > 0 else sampled[: len(result_tokens)] == result_tokens,
        avg_logprob=replay["avg_logprob"],
        self_kv_bytes=replay["self_kv_bytes"],
        cross_kv_bytes=[kv.nbytes for kv in cross_kv],
        reorders=replay["reorders"],
        timings_ms={
            "log_mel_whole_file": log_mel_ms,
            "encoder": encoder_ms,
            "cross_kv_projection": cross_kv_ms,
            "decoder_steps": replay["step_ms"],
        },
        words=[{k: w[k] for k in ("word", "start", "end", "probability")} for w in words],
        alignment_tokens=["<|notimestamps|>", *(_text(tokenizer, t) for t in text_tokens)],
        waveform=audio,
        mel=mel[0].float().cpu().numpy(),
        features=features[0].float().cpu().numpy(),
        alignment=matrix.cpu().numpy(),
    )


def _replay(model: Whisper, tokenizer: Tokenizer, cross_kv: list, options: DecodingOptions) -> dict:
    """The decoding loop of ``decode_windows`` for one window, with a stopwatch and a ruler per call."""
    n_ctx = model.dims.n_text_ctx
    prompt, sample_len, sample_begin, sot_index, filters = plan_decode(model, tokenizer, options)
    if options.beam_size:
        n_group, searcher = options.beam_size, BeamSearch(options.beam_size, tokenizer.eot, options.patience)
    else:
        n_group, searcher = 1, GreedySearch(0.0, tokenizer.eot)
    choice = GreedyChoice.for_window(searcher, filters)
    tokens = torch.tensor([prompt] * n_group, device=model.device)
    cache = model.decoder.new_cache(cross_kv, batch_size=n_group)
    sum_logprobs = torch.zeros(n_group)
    step_ms, self_kv_bytes, reorders = [], [], []
    new = tokens
    for step in range(sample_len):
        t0 = time.perf_counter()
        logits = model.decoder(new, cache, positions=[sot_index, sample_begin - 1] if step == 0 else None)
        logits = logits[:, -1].clone()
        tokens, completed, sources = choose_next(choice, filters, searcher, tokens, logits, sum_logprobs)
        if sources is not None:
            if not torch.equal(sources.cpu(), torch.arange(len(sources))):
                reorders.append(step)
            cache.reorder(sources.to(model.device))
        step_ms.append(_ms(t0))
        self_kv_bytes.append([kv.nbytes for kv in cache.self_kv])
        if completed or tokens.shape[-1] > n_ctx:
            break
        new = tokens[:, -1:]
    candidates, scores = searcher.finalize(
        tokens.reshape(1, n_group, -1).cpu(), sum_logprobs.reshape(1, n_group)
    )
    texts = []
    for cand in candidates[0]:
        cand = cand.tolist() if isinstance(cand, torch.Tensor) else list(cand)
        texts.append(cand[sample_begin : cand.index(tokenizer.eot, sample_begin)])
    best = rank(texts, scores[0], options.length_penalty)
    return {
        "prompt": prompt,
        "tokens": texts[best],
        "avg_logprob": scores[0][best] / (len(texts[best]) + 1),
        "step_ms": step_ms,
        "self_kv_bytes": self_kv_bytes,
        "reorders": reorders,
    }


def _steps(
    model: Whisper,
    tokenizer: Tokenizer,
    cross_kv: list,
    options: DecodingOptions,
    prompt: list[int],
    sampled: list[int],
) -> list[Step]:
    """Probabilities along the final sequence: one teacher-forced pass, the same logit filters per step."""
    sequence = torch.tensor([prompt + sampled + [tokenizer.eot]], device=model.device)
    cache = model.decoder.new_cache(cross_kv, batch_size=1)
    logits = model.decoder(sequence, cache)[0].float()
    filters = logit_filters(tokenizer, options, len(prompt), model.dims.n_audio_ctx)
    steps = []
    for i, token in enumerate([*sampled, tokenizer.eot]):
        position = len(prompt) + i
        row = logits[position - 1 : position].clone()
        for f in filters:
            f.apply(row, sequence[:, :position])
        probs = row[0].softmax(dim=-1)
        top = torch.topk(probs, TOP_K)
        steps.append(
            Step(
                position=position,
                token=int(token),
                text=_text(tokenizer, int(token)),
                probability=float(probs[token]),
                top=[(int(t), _text(tokenizer, int(t)), float(p)) for p, t in zip(top.values, top.indices)],
                kind=_kind(tokenizer, int(token)),
            )
        )
    return steps
