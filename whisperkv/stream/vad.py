"""Voice activity from silero-vad: where speech starts and where an utterance ends.

silero-vad judges 512-sample frames (32 ms at 16 kHz) and keeps state between them, so audio can be fed
in pieces of any size: the remainder that does not fill a frame waits for the next piece. Its
``VADIterator`` reports a start (padded back by ``speech_pad_ms``) and an end once
``min_silence_ms`` of silence has followed speech. The ONNX model is used when onnxruntime is
installed (about 5x faster per frame on this CPU than the TorchScript one, which is the fallback).

Between utterances the detector also notes the frames that came near speech (``MAYBE_SPEECH``): a
pause holding one is worth decoding once (whispered words scored 0.13 where the threshold is 0.5;
silence and breath between read sentences mostly under 0.1).

Positions are the stream's: ``VADIterator`` counts from its last reset, so each reset (a client's
commit or clear) records where the stream was, and every boundary is given from the stream's start.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from whisperkv.audio import SAMPLE_RATE

FRAME = 512
#: a pause whose most speech-like frame scores at least this may hold words the VAD did not start on
MAYBE_SPEECH = 0.1


class _Scored:
    """The VAD model as ``VADIterator`` calls it, keeping each frame's speech probability."""

    def __init__(self, model) -> None:  # noqa: ANN001 - silero's ONNX or TorchScript model
        self.model = model
        self.last = 0.0

    def __call__(self, x: torch.Tensor, sampling_rate: int) -> torch.Tensor:
        out = self.model(x, sampling_rate)
        self.last = float(out)
        return out

    def reset_states(self) -> None:
        self.model.reset_states()


@dataclass(frozen=True)
class SpeechBoundary:
    kind: str  # "start" or "end"
    sample: int  # absolute sample index in the stream


def silero():
    """The silero_vad module. Importing it sets torch's thread count to 1 for the whole process (its
    model.py does so), which would halve the decoder's speed on two cores: the count is put back."""
    threads = torch.get_num_threads()
    import silero_vad

    torch.set_num_threads(threads)
    return silero_vad


def load_vad_model():
    load_silero_vad = silero().load_silero_vad
    with warnings.catch_warnings():  # silero-vad 6 locates its model with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return load_silero_vad(onnx=True)
        except ImportError:  # onnxruntime missing: the TorchScript model ships with the package too
            return load_silero_vad()


class SpeechDetector:
    """Feed samples, get speech starts and ends (absolute sample positions)."""

    def __init__(
        self,
        model=None,
        threshold: float = 0.5,
        min_silence_ms: int = 500,
        speech_pad_ms: int = 300,
    ) -> None:
        self.scored = _Scored(model if model is not None else load_vad_model())
        self.iterator = silero().VADIterator(
            self.scored,
            threshold=threshold,
            sampling_rate=SAMPLE_RATE,
            min_silence_duration_ms=min_silence_ms,
            speech_pad_ms=speech_pad_ms,
        )
        self.pending = np.zeros(0, dtype=np.float32)
        self.in_speech = False
        self.fed = 0  # stream samples given to ``process``
        self.offset = 0  # the stream sample of the iterator's sample 0 (where it was last reset)
        self.near_speech: list[int] = []  # stream samples of pause frames scoring at least MAYBE_SPEECH
        self.pad = speech_pad_ms * SAMPLE_RATE // 1000  # samples a start is dated back, an end forward

    def process(self, samples: np.ndarray) -> list[SpeechBoundary]:
        """Boundaries found in the frames these samples complete, in order."""
        audio = np.concatenate([self.pending, samples.astype(np.float32, copy=False)])
        first = self.fed - len(self.pending)  # the stream sample of audio[0]
        self.fed += len(samples)
        n_frames = len(audio) // FRAME
        self.pending = audio[n_frames * FRAME :]
        found: list[SpeechBoundary] = []
        for i in range(n_frames):
            frame = torch.from_numpy(audio[i * FRAME : (i + 1) * FRAME].copy())
            result = self.iterator(frame)
            if not self.in_speech and self.scored.last >= MAYBE_SPEECH:
                self.near_speech.append(first + i * FRAME)
            if not result:
                continue
            if "start" in result and not self.in_speech:
                self.in_speech = True
                found.append(SpeechBoundary("start", self.offset + int(result["start"])))
            elif "end" in result and self.in_speech:
                self.in_speech = False
                found.append(SpeechBoundary("end", self.offset + int(result["end"])))
        return found

    def maybe_speech(self, start: int, end: int) -> bool:
        """Whether a pause frame in stream samples [start, end) came near speech; frames before ``end``
        are forgotten (each stretch of a pause is asked about once)."""
        found = any(start <= s < end for s in self.near_speech)
        self.near_speech = [s for s in self.near_speech if s >= end]
        return found

    def last_near_speech(self, start: int) -> int | None:
        """The stream sample just after the last pause frame from ``start`` on that came near speech, if
        any (nothing is forgotten: ``maybe_speech`` does that). The list is in stream order: its last."""
        if not self.near_speech or self.near_speech[-1] < start:
            return None
        return self.near_speech[-1] + FRAME

    def warm(self) -> None:
        """Judge a second of silence and forget it: the model's first frames cost more than later ones."""
        self.process(np.zeros(SAMPLE_RATE, dtype=np.float32))
        self.reset()
        self.fed = self.offset = 0  # the stream starts after the warm-up

    def reset(self) -> None:
        """Forget the audio so far (what is fed next is judged afresh); positions stay the stream's."""
        self.iterator.reset_states()
        self.pending = np.zeros(0, dtype=np.float32)
        self.in_speech = False
        self.offset = self.fed
        self.near_speech = []
