"""``GET /openai/v1/models`` and ``GET /openai/v1/models/{model}``: the route aliases in
OpenAI's shape (:mod:`relay_batches.dialects.openai.models`), so ``client.models.list()``
and ``client.models.retrieve()`` work. A name an alias pattern matches is retrievable;
anything else is a 404 naming ``model``."""

from __future__ import annotations

from aiohttp import web

from relay_batches.dialects.openai.models import model_list, model_object
from relay_batches.errors import ApiError
from relay_batches.services.ingest_api.deps import DEPS
from relay_batches.services.ingest_api.edge.middleware import json_response


def add_model_routes(app: web.Application) -> None:
    """Register the model routes on the surface's application."""
    app.router.add_get("/models", list_models)
    app.router.add_get("/models/{model}", get_model)


async def list_models(request: web.Request) -> web.Response:
    """``GET /models``: every route alias, sorted by id."""
    deps = request.app[DEPS]
    return json_response(model_list(deps.model_names(), int(deps.routes_loaded_at.timestamp())))


async def get_model(request: web.Request) -> web.Response:
    """``GET /models/{model}``: one alias (or a name its patterns match), else 404."""
    deps = request.app[DEPS]
    name = request.match_info["model"]
    if not deps.model_known(name):
        raise ApiError(404, f"The model {name[:80]!r} does not exist", "model")
    return json_response(model_object(name, int(deps.routes_loaded_at.timestamp())))
