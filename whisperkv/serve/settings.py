"""What one running server was configured with: which model it serves, limits, and its key."""

from __future__ import annotations

from dataclasses import dataclass

#: the model name OpenAI's clients send; the server treats it as the model it serves
OPENAI_MODEL_ALIAS = "whisper-1"


@dataclass(frozen=True)
class ServeSettings:
    """Settings the routes read; built by the ``serve`` command (or a test) and stored on the app."""

    model_name: str = "tiny.en"
    api_key: str | None = None
    max_upload_bytes: int = 100 * 1024 * 1024
    #: longest audio an upload may hold, in seconds (``--max_audio_s``): longer is a 413, found while
    #: decoding; it bounds the work one request asks for (memory is bounded anyway: read by windows)
    max_audio_s: float = 3 * 3600.0
    #: seconds a client is told to wait (``Retry-After``) when the queue is full
    retry_after_s: int = 1
    #: seconds a client has to send a whole request body (a trickling upload is a 408 after it)
    body_timeout_s: float = 30.0
    #: Realtime WebSocket sessions open at once (one more is refused before its handshake)
    realtime_max_sessions: int = 16
    #: seconds of audio one Realtime session may hold uncommitted (an append past it is an error event)
    realtime_buffer_s: float = 60.0

    @property
    def served_names(self) -> tuple[str, ...]:
        """Names a request may put in ``model``: the served model and OpenAI's alias for it."""
        return (self.model_name, OPENAI_MODEL_ALIAS)
