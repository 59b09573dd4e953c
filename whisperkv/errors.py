"""Errors the engine raises on purpose, each naming what went wrong and where.

They all derive from WhisperKVError so the CLI can turn any of them into one clear line and a
non-zero exit, while genuine bugs still surface as tracebacks.
"""

from __future__ import annotations


class WhisperKVError(Exception):
    """Base class of every error whisperkv raises deliberately."""


class AudioError(WhisperKVError):
    """An input could not be read as audio: missing, not audio, truncated, or empty."""

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")


class ModelLoadError(WhisperKVError):
    """Weights could not be found or parsed."""


class CacheReuseError(WhisperKVError):
    """A cache was offered for reuse but its provenance does not match what is being computed.

    ``field`` names the first provenance field that differs, so the refusal says exactly why.
    """

    def __init__(self, kind: str, field: str, cached: object, requested: object) -> None:
        self.kind = kind
        self.field = field
        self.cached = cached
        self.requested = requested
        super().__init__(
            f"refusing to reuse {kind}: provenance field '{field}' differs "
            f"(cache has {cached!r}, request needs {requested!r})"
        )


class QueueFullError(WhisperKVError):
    """The scheduler already holds its maximum of queued and running jobs; try again later."""


class ShuttingDownError(WhisperKVError):
    """The scheduler is stopping and accepts no new jobs."""


class JobCancelledError(WhisperKVError):
    """The job was cancelled (its client went away) before it finished."""


class SealedCacheError(CacheReuseError):
    """A sealed encoder output or Cross-KV from across a trust boundary was refused (issue 11).

    ``reason`` says why: an associated-data field that differs from what was asked for (``field``
    names it), a failed authentication (altered bytes, another key: other secret, weights or session),
    a replayed or reordered blob, a malformed or truncated blob, or a worker that refused the request.
    """

    def __init__(
        self, reason: str, field: str = "seal", cached: object = None, requested: object = None
    ) -> None:
        self.kind = "sealed cache"
        self.field = field
        self.cached = cached
        self.requested = requested
        self.reason = reason
        WhisperKVError.__init__(self, f"refusing sealed cache: {reason}")


class TokenizerOptionError(WhisperKVError, ValueError):
    """A language or task was asked for that this model's vocabulary cannot express."""
