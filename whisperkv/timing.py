"""Word-level timestamps: where in the audio did the decoder "look" while writing each word?

A few cross-attention heads of the decoder (the *alignment heads*) attend, token by token, to the
audio positions being transcribed. Word timing reads them once the text of a window is known:

1. run the decoder over ``[sot…, no_timestamps, text…, eot]`` against the window's Cross-KV (reused,
   never re-encoded), keeping the alignment heads' attention over the real audio (the first
   ``num_frames // 2`` encoder positions; the padding beyond is dropped and each row renormalised);
2. standardise each head over the token axis, smooth along time with a width-7 median filter, average
   the heads: a token × time similarity matrix;
3. dynamic time warping finds the monotonic token → time path of greatest total similarity;
4. a word starts where the path first reaches its first token (0.02 s per encoder position);
5. clean-up as the reference does: over-long words at sentence and segment boundaries are cut,
   leading / trailing punctuation joins its neighbour, segments take their first and last word's times.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from whisperkv.audio import HOP_LENGTH, SAMPLE_RATE, TOKENS_PER_SECOND

# the signal steps, and the reference's names for them (``whisper.timing.dtw_cpu`` ...), importable from here
from whisperkv.timing_signal import dtw, dtw_cpu, dtw_cuda, median_filter  # noqa: F401

if TYPE_CHECKING:
    from whisperkv.cache.kv import CrossKV
    from whisperkv.cache.store import CacheStore, EncodedWindow
    from whisperkv.model.whisper import Whisper
    from whisperkv.tokenizer import Tokenizer

DEFAULT_PREPEND_PUNCTUATIONS = "\"'“¿([{-"
DEFAULT_APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END_MARKS = ".。!！?？"


@dataclass
class WordTiming:
    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float
    #: the least probability of the punctuation ``merge_punctuations`` attached (1.0: none); not in the
    #: reference's output (its ``probability`` is the word's own tokens'), a live stream's sureness
    marks_probability: float = 1.0


# --------------------------------------------------------------------------------- alignment


def alignment_heads(model: Whisper) -> list[tuple[int, int]]:
    """The (layer, head) pairs read for timing: the model's table, else every head of the upper half."""
    if model.alignment_heads:
        return [(int(layer), int(head)) for layer, head in model.alignment_heads]
    n_layer, n_head = model.dims.n_text_layer, model.dims.n_text_head
    return [(layer, head) for layer in range(n_layer // 2, n_layer) for head in range(n_head)]


def _window_cross_kv(
    model: Whisper, mel: torch.Tensor | None, window: EncodedWindow | None, store: CacheStore | None
) -> list[CrossKV]:
    if window is not None:
        if store is not None:
            store.hits.append("word alignment: encoder output and Cross-KV reused")
        return window.cross_kv
    if mel is None:
        raise ValueError("word alignment needs the window's Cross-KV or its log-Mel spectrogram")
    mel = (mel if mel.ndim == 3 else mel.unsqueeze(0)).to(model.device, model.dtype)
    if store is not None:
        return store.encode(model, mel, 0, mel.shape[-1] * HOP_LENGTH, "word alignment").cross_kv
    features = model.embed_audio(mel)
    return model.decoder.project_cross_kv(features, model.encoder_provenance(mel))


def alignment_matrix(
    model: Whisper,
    tokenizer: Tokenizer,
    text_tokens: list[int],
    num_frames: int,
    *,
    cross_kv: list[CrossKV],
    medfilt_width: int = 7,
    qk_scale: float = 1.0,
) -> tuple[torch.Tensor, list[float]]:
    """The alignment heads' normalised cross-attention [1 + tokens, num_frames // 2] and token probabilities.

    Rows are <|notimestamps|> then each text token; columns the encoder positions over real audio. DTW
    through this matrix gives word timings; ``whisperkv explain`` draws it.
    """
    sot_len = len(tokenizer.sot_sequence)
    sequence = [*tokenizer.sot_sequence, tokenizer.no_timestamps, *text_tokens, tokenizer.eot]
    tokens = torch.tensor([sequence], dtype=torch.long, device=model.device)
    with torch.no_grad():
        logits, layer_weights = model.decoder.cross_attention_weights(tokens, cross_kv)

        # Probability of each text token given what precedes it, over text tokens only.
        probs = logits[0, sot_len : sot_len + len(text_tokens), : tokenizer.eot].float().softmax(dim=-1)
        index = torch.tensor(text_tokens, dtype=torch.long, device=probs.device)
        token_probs = probs[torch.arange(len(text_tokens), device=probs.device), index].tolist()

        heads = alignment_heads(model)
        weights = torch.stack([layer_weights[layer][0, head] for layer, head in heads]).float()
        # Attention restricted to the real audio: a softmax over a prefix of the scores equals the full
        # softmax's weights on that prefix, renormalised (qk_scale s: weights**s, renormalised).
        weights = weights[:, :, : num_frames // 2]
        if qk_scale != 1.0:
            weights = weights.pow(qk_scale)
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
        std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
        weights = (weights - mean) / std
        weights = median_filter(weights, medfilt_width)
        matrix = weights.mean(dim=0)[sot_len:-1]  # rows: no_timestamps, then each text token
    return matrix, token_probs


def find_alignment(
    model: Whisper,
    tokenizer: Tokenizer,
    text_tokens: list[int],
    num_frames: int,
    *,
    cross_kv: list[CrossKV],
    medfilt_width: int = 7,
    qk_scale: float = 1.0,
) -> list[WordTiming]:
    """Word timings (seconds from the window start) for ``text_tokens`` decoded from one window."""
    if len(text_tokens) == 0:
        return []
    matrix, token_probs = alignment_matrix(
        model,
        tokenizer,
        text_tokens,
        num_frames,
        cross_kv=cross_kv,
        medfilt_width=medfilt_width,
        qk_scale=qk_scale,
    )
    text_indices, time_indices = dtw(-matrix.double().cpu().numpy())

    words, word_tokens = tokenizer.split_to_word_tokens(list(text_tokens) + [tokenizer.eot])
    if len(word_tokens) <= 1:
        return []  # only end of text
    word_boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    # The path reaches a new token row at a "jump"; that column is when the token starts.
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    start_times = jump_times[word_boundaries[:-1]]
    end_times = jump_times[word_boundaries[1:]]
    probabilities = [
        float(np.mean(token_probs[i:j]))
        for i, j in zip(word_boundaries[:-1], word_boundaries[1:], strict=True)
    ]
    return [  # the last "word" is end of text itself and gets no timing
        WordTiming(word, list(tokens_), float(start), float(end), probability)
        for word, tokens_, start, end, probability in zip(
            words[:-1], word_tokens[:-1], start_times, end_times, probabilities, strict=True
        )
    ]


def merge_punctuations(alignment: list[WordTiming], prepended: str, appended: str) -> None:
    """Attach opening punctuation to the word after it and closing punctuation to the word before.

    The emptied entries stay in place with ``word == ""`` and no tokens (they are skipped later), so
    token counts per segment still add up.
    """
    # Right to left: a spaced opening mark (' "', ' (') moves onto the next non-empty word.
    target = len(alignment) - 1
    for i in range(len(alignment) - 2, -1, -1):
        mark, following = alignment[i], alignment[target]
        if mark.word.startswith(" ") and mark.word.strip() in prepended:
            following.word = mark.word + following.word
            following.tokens = mark.tokens + following.tokens
            following.marks_probability = min(following.marks_probability, mark.probability)
            mark.word, mark.tokens = "", []
        else:
            target = i
    # Left to right: a closing mark (',', '.', '"') moves onto the previous word.
    target = 0
    for i in range(1, len(alignment)):
        previous, mark = alignment[target], alignment[i]
        if not previous.word.endswith(" ") and mark.word in appended:
            previous.word = previous.word + mark.word
            previous.tokens = previous.tokens + mark.tokens
            previous.marks_probability = min(previous.marks_probability, mark.probability)
            mark.word, mark.tokens = "", []
        else:
            target = i


def _round(value: float) -> float:
    # numpy's rounding, as the reference rounds numpy floats (e.g. 1.005 → 1.0 either way, but not all
    # values agree between Python's and numpy's round at the second decimal).
    return float(np.round(np.float64(value), 2))


def add_word_timestamps(
    *,
    segments: list[dict],
    model: Whisper,
    tokenizer: Tokenizer,
    mel: torch.Tensor | None = None,
    num_frames: int,
    prepend_punctuations: str = DEFAULT_PREPEND_PUNCTUATIONS,
    append_punctuations: str = DEFAULT_APPEND_PUNCTUATIONS,
    last_speech_timestamp: float,
    window: EncodedWindow | None = None,
    store: CacheStore | None = None,
    medfilt_width: int = 7,
    qk_scale: float = 1.0,
    with_marks: bool = False,
) -> None:
    """Give every segment of one window a ``"words"`` list; adjust segment start/end to the words.

    ``segments`` are the window's segments (same ``seek``); ``num_frames`` is how many Mel frames of
    the window are real audio. The window's encoder output and Cross-KV are reused when ``window`` is
    given (the usual case); ``mel`` is only encoded when it is not. ``with_marks``: each word also
    carries ``"probability_with_marks"``, its probability or its punctuation's if lower (a live stream
    commits a word at its first hearing by it: "country." is only as sure as its full stop).
    """
    if len(segments) == 0:
        return
    text_tokens_per_segment = [[t for t in segment["tokens"] if t < tokenizer.eot] for segment in segments]
    text_tokens = list(itertools.chain.from_iterable(text_tokens_per_segment))
    alignment: list[WordTiming] = []
    if text_tokens:
        cross_kv = _window_cross_kv(model, mel, window, store)
        alignment = find_alignment(
            model,
            tokenizer,
            text_tokens,
            num_frames,
            cross_kv=cross_kv,
            medfilt_width=medfilt_width,
            qk_scale=qk_scale,
        )

    median_duration, max_duration = _clamp_long_words(alignment)
    merge_punctuations(alignment, prepend_punctuations, append_punctuations)

    time_offset = segments[0]["seek"] * HOP_LENGTH / SAMPLE_RATE
    word_index = 0
    for segment, seg_tokens in zip(segments, text_tokens_per_segment, strict=True):
        words, word_index = _segment_words(alignment, word_index, len(seg_tokens), time_offset, with_marks)
        if words:
            _fit_segment(segment, words, last_speech_timestamp, median_duration, max_duration)
            last_speech_timestamp = segment["end"]
        segment["words"] = words


def _clamp_long_words(alignment: list[WordTiming]) -> tuple[float, float]:
    """Words next to a sentence end tend to swallow the pause: keep them within twice the median length
    (capped at 0.7 s). Returns (median, most) word duration, which the segments' fitting uses too."""
    durations = np.array([t.end - t.start for t in alignment])
    durations = durations[durations.nonzero()]
    median_duration = min(0.7, float(np.median(durations))) if len(durations) > 0 else 0.0
    max_duration = median_duration * 2
    if len(durations) > 0:
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > max_duration:
                if alignment[i].word in SENTENCE_END_MARKS:
                    alignment[i].end = alignment[i].start + max_duration
                elif alignment[i - 1].word in SENTENCE_END_MARKS:
                    alignment[i].start = alignment[i].end - max_duration
    return median_duration, max_duration


def _segment_words(
    alignment: list[WordTiming], word_index: int, n_tokens: int, time_offset: float, with_marks: bool
) -> tuple[list[dict], int]:
    """The words of one segment (those its ``n_tokens`` text tokens make), from ``word_index`` on, in
    seconds from the start of the audio; and the index of the next segment's first word."""
    consumed = 0
    words: list[dict] = []
    while word_index < len(alignment) and consumed < n_tokens:
        timing = alignment[word_index]
        if timing.word:
            words.append(
                {
                    "word": timing.word,
                    "start": _round(time_offset + timing.start),
                    "end": _round(time_offset + timing.end),
                    "probability": timing.probability,
                }
            )
            if with_marks:
                words[-1]["probability_with_marks"] = min(timing.probability, timing.marks_probability)
        consumed += len(timing.tokens)
        word_index += 1
    return words, word_index


def _fit_segment(
    segment: dict, words: list[dict], last_speech: float, median_duration: float, max_duration: float
) -> None:
    """The reference's adjustments of a segment's first and last words and of its own start and end."""
    first = words[0]
    # After a pause the first word (or first two) may stretch back into the silence: cut them.
    if first["end"] - last_speech > median_duration * 4 and (
        first["end"] - first["start"] > max_duration
        or (len(words) > 1 and words[1]["end"] - first["start"] > max_duration * 2)
    ):
        if len(words) > 1 and words[1]["end"] - words[1]["start"] > max_duration:
            boundary = max(words[1]["end"] / 2, words[1]["end"] - max_duration)
            first["end"] = words[1]["start"] = boundary
        first["start"] = max(0, first["end"] - max_duration)

    # A first word much longer than the segment's own start suggests: trust the segment.
    if segment["start"] < first["end"] and segment["start"] - 0.5 > first["start"]:
        first["start"] = max(0, min(first["end"] - median_duration, segment["start"]))
    else:
        segment["start"] = first["start"]

    # Likewise for a last word running well past the segment's end.
    last = words[-1]
    if segment["end"] > last["start"] and segment["end"] + 0.5 < last["end"]:
        last["end"] = max(last["start"] + median_duration, segment["end"])
    else:
        segment["end"] = last["end"]


# --------------------------------------------------------------------------------- helpers for transcribe


def get_end(segments: list[dict]) -> float | None:
    """End of the last word of the last segment that has words; else the last segment's end."""
    for segment in reversed(segments):
        for word in reversed(segment.get("words") or []):
            return word["end"]
    return segments[-1]["end"] if segments else None


#: below this probability a word is improbable (Whisper's hallucination rule)
IMPROBABLE_WORD = 0.15
#: a word dated shorter than this (seconds) is implausibly short (the same rule)
SHORTEST_PLAUSIBLE_WORD = 0.133


def word_anomaly_score(word: dict) -> float:
    """How hallucination-like a word looks: improbable, implausibly short, or implausibly long."""
    probability = word.get("probability", 0.0)
    duration = word["end"] - word["start"]
    score = 0.0
    if probability < IMPROBABLE_WORD:
        score += 1.0
    if duration < SHORTEST_PLAUSIBLE_WORD:
        score += (SHORTEST_PLAUSIBLE_WORD - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def is_segment_anomaly(segment: dict | None, punctuation: str) -> bool:
    """Whether a segment's first (up to 8) non-punctuation words look hallucinated."""
    if segment is None or not segment.get("words"):
        return False
    words = [w for w in segment["words"] if w["word"] not in punctuation][:8]
    score = sum(word_anomaly_score(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def next_words_segment(segments: list[dict]) -> dict | None:
    """The first segment that has words, if any."""
    return next((s for s in segments if s.get("words")), None)
