"""faster-whisper's Python API on whisperkv's engine: change the import, keep the code.

    from whisperkv import WhisperModel          # was: from faster_whisper import WhisperModel
    model = WhisperModel("tiny.en", device="cpu", compute_type="int8")
    segments, info = model.transcribe("audio.flac", beam_size=5)   # segments: a lazy generator

The names, signatures and return types are faster-whisper's (1.2); the numbers are whisperkv's (its
decoder follows openai-whisper's). Options whisperkv cannot honour are refused by name, never ignored.
"""

from whisperkv.faster.audio import decode_audio
from whisperkv.faster.batched import BatchedInferencePipeline
from whisperkv.faster.model import WhisperModel
from whisperkv.faster.types import Segment, TranscriptionInfo, TranscriptionOptions, VadOptions, Word

__all__ = [
    "BatchedInferencePipeline",
    "Segment",
    "TranscriptionInfo",
    "TranscriptionOptions",
    "VadOptions",
    "WhisperModel",
    "Word",
    "decode_audio",
]
