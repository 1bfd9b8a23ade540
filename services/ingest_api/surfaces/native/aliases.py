"""``GET /v1/models``: the router's public aliases."""

from __future__ import annotations

from aiohttp import web

from relay_batches.services.ingest_api.deps import DEPS
from relay_batches.services.ingest_api.edge.middleware import json_response


def add_model_routes(app: web.Application) -> None:
    """Register ``GET /v1/models`` on ``app``."""
    app.router.add_get("/models", list_models)


async def list_models(request: web.Request) -> web.Response:
    """``GET /v1/models``: ``{object: list, data: [{id, object: model}]}``, sorted by id."""
    names = sorted(request.app[DEPS].model_names())
    return json_response(
        {"object": "list", "data": [{"id": name, "object": "model"} for name in names]}
    )
