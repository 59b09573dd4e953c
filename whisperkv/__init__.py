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
from whisperkv.decoding.language import detect_language as _detect_language
from whisperkv.decoding.options import DecodingOptions, DecodingResult
from whisperkv.errors import AudioError, CacheReuseError, ModelLoadError, WhisperKVError
from whisperkv.faster import BatchedInferencePipeline, WhisperModel, decode_audio
from whisperkv.language_detection import detect_language
from whisperkv.load import load_model
from whisperkv.model.whisper import Whisper as _Whisper
from whisperkv.transcribe import transcribe
from whisperkv.weights import available_models

# openai-whisper's model methods, bound here so that the network (``model/``) never imports the
# decoding loop: ``model.decode(mel, options)``, ``model.transcribe(audio, **options)`` and
# ``model.detect_language(audio_or_mel)`` (whisperkv's shape: the code and every probability)
_Whisper.decode = decode
_Whisper.transcribe = transcribe
_Whisper.detect_language = _detect_language

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
