"""GET /v1/models (OpenAI's list shape), /health and /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from whisperkv.serve.auth import require_api_key
from whisperkv.serve.errors import APIError
from whisperkv.serve.responses import JSONBody

router = APIRouter()


def _model_card(name: str, created: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "whisperkv"}


@router.get("/v1/models", dependencies=[Depends(require_api_key)])
async def list_models(request: Request) -> Response:
    """The served model and its ``whisper-1`` alias."""
    settings, created = request.app.state.settings, request.app.state.lifecycle.started_at
    return JSONBody({"object": "list", "data": [_model_card(n, created) for n in settings.served_names]})


@router.get("/v1/models/{model_id}", dependencies=[Depends(require_api_key)])
async def get_model(request: Request, model_id: str) -> Response:
    settings, created = request.app.state.settings, request.app.state.lifecycle.started_at
    if model_id not in settings.served_names:
        raise APIError(404, f"the model '{model_id}' does not exist", param="model", code="model_not_found")
    return JSONBody(_model_card(model_id, created))


@router.get("/health")
async def health(request: Request) -> Response:
    """200 while serving; 503 once shutdown began (a load balancer stops sending work)."""
    lifecycle = request.app.state.lifecycle
    if lifecycle.shutting_down:
        return JSONBody({"status": "shutting_down"}, status_code=503)
    return JSONBody({"status": "ok", "model": request.app.state.settings.model_name})


@router.get("/metrics", dependencies=[Depends(require_api_key)])
async def metrics(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
