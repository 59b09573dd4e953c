"""whisperkv's OpenAI-compatible HTTP server: ``create_app(model, scheduler, settings)``, ``whisperkv serve``.

The web stack is imported on first use, so ``whisperkv --help`` does not pay for FastAPI.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OPENAI_MODEL_ALIAS", "ServeSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from whisperkv.serve.app import create_app

        return create_app
    if name in ("ServeSettings", "OPENAI_MODEL_ALIAS"):
        from whisperkv.serve import settings

        return getattr(settings, name)
    raise AttributeError(name)
