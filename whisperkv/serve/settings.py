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
    #: seconds a client is told to wait (``Retry-After``) when the queue is full
    retry_after_s: int = 1

    @property
    def served_names(self) -> tuple[str, ...]:
        """Names a request may put in ``model``: the served model and OpenAI's alias for it."""
        return (self.model_name, OPENAI_MODEL_ALIAS)
