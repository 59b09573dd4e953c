"""whisperkv: Whisper speech recognition with first-class Self-KV and Cross-KV caches.

import whisperkv
model = whisperkv.load_model("tiny.en")        # offline: the embedded default model
result = model.transcribe("speech.flac")       # {"text", "segments", "language", "cache"}

``import whisperkv as whisper`` runs code written for openai-whisper: its names (``load_model``,
``transcribe``, ``decode``, ``detect_language``, ``tokenizer.get_tokenizer``, ``timing``, ``utils``,
``normalizers``) take the same arguments; openai-whisper's own test suite checks it
(``tests/test_openai_whisper_suite.py``).
"""

from whisperkv import timing, tokenizer, utils  # ``whisper.tokenizer`` & co. as attributes, as there
from whisperkv.audio import load_audio, log_mel_spectrogram, pad_or_trim
from whisperkv.decoding.decode import decode
from whisperkv.decoding.options import DecodingOptions, DecodingResult
from whisperkv.errors import AudioError, CacheReuseError, ModelLoadError, WhisperKVError
from whisperkv.faster import BatchedInferencePipeline, WhisperModel, decode_audio
from whisperkv.language_detection import detect_language
from whisperkv.model import load_model
from whisperkv.transcribe import transcribe
from whisperkv.weights import available_models

__version__ = "0.1.0"

__all__ = [
    "AudioError",
    "BatchedInferencePipeline",
    "CacheReuseError",
    "DecodingOptions",
    "DecodingResult",
    "ModelLoadError",
    "WhisperKVError",
    "WhisperModel",
    "available_models",
    "decode",
    "decode_audio",
    "detect_language",
    "load_audio",
    "load_model",
    "log_mel_spectrogram",
    "pad_or_trim",
    "timing",
    "tokenizer",
    "transcribe",
    "utils",
]
