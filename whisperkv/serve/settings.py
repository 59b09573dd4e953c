"""What one running server was configured with: which model it serves, limits, and its key."""

from __future__ import annotations

from dataclasses import dataclass, field

#: the model name OpenAI's clients send; the server treats it as the model it serves
OPENAI_MODEL_ALIAS = "whisper-1"


@dataclass(frozen=True)
class RequestLimits:
    """The most work one request may ask for (``serve --max_beam_size`` ...); over a limit is a 400 naming
    the option and the limit. Each bounds a cost a client could otherwise multiply at will: beams and
    samples are decoder rows shared with every other request, each fallback temperature may decode a
    window again, and a long prompt is tokenized (and attended to) in every window."""

    #: beams per window (``beam_size``); the CLI's default is 5
    max_beam_size: int = 8
    #: samples per window when sampling (``best_of``); ``transcribe()``'s default is 5
    max_best_of: int = 8
    #: temperatures in the fallback schedule (``transcribe()``'s default schedule has 6; 11 is 0.1 steps)
    max_temperatures: int = 11
    #: tokens of ``prompt``/``initial_prompt``, ``prefix`` and ``hotwords``, each: the decoder keeps only the
    #: last 223 of a prompt anyway (half the text context less one); text over 6 characters per allowed
    #: token is refused before it is tokenized (tokenizing one long word takes time quadratic in its length)
    max_prompt_tokens: int = 223
    #: tokens sampled per window (``sample_len``); the default is half the text context, 224
    max_sample_len: int = 224


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
    #: the most work one request may ask for (``--max_beam_size``, ``--max_prompt_tokens``, ...)
    limits: RequestLimits = field(default_factory=RequestLimits)

    @property
    def served_names(self) -> tuple[str, ...]:
        """Names a request may put in ``model``: the served model and OpenAI's alias for it."""
        return (self.model_name, OPENAI_MODEL_ALIAS)
