"""``GET /anthropic/v1/models`` and ``GET /anthropic/v1/models/{model_id}``: the route
aliases in Anthropic's shape (:mod:`relay_batches.dialects.anthropic.models`), so
``client.models.list()`` (paged by ``limit``, ``after_id``, ``before_id``) and
``client.models.retrieve()`` work. A name an alias pattern matches is retrievable;
anything else is a 404."""

from __future__ import annotations

from aiohttp import web

from relay_batches.dialects.anthropic.models import DEFAULT_PAGE, MAX_PAGE, model_info, model_page
from relay_batches.errors import ApiError, invalid
from relay_batches.services.ingest_api.deps import DEPS
from relay_batches.services.ingest_api.edge.middleware import json_response
from relay_batches.services.ingest_api.edge.paging import page_limit

MODELS = "/models"


def add_model_routes(app: web.Application) -> None:
    """Register the model routes on the surface's application."""
    app.router.add_get(MODELS, list_models)
    app.router.add_get(f"{MODELS}/{{model_id}}", get_model)


async def list_models(request: web.Request) -> web.Response:
    """``GET /models``: a page of route aliases in id order."""
    query = request.query
    limit = page_limit(query.get("limit"), DEFAULT_PAGE, MAX_PAGE, "limit:")
    after, before = query.get("after_id"), query.get("before_id")
    if after is not None and before is not None:
        raise invalid("after_id and before_id cannot both be given", "before_id")
    deps = request.app[DEPS]
    page = model_page(deps.model_names(), deps.routes_loaded_at, limit, after, before)
    return json_response(page)


async def get_model(request: web.Request) -> web.Response:
    """``GET /models/{model_id}``: one alias (or a name its patterns match), else 404."""
    deps = request.app[DEPS]
    name = request.match_info["model_id"]
    if not deps.model_known(name):
        raise ApiError(404, f"model: {name[:80]!r} is not a model", "model_id")
    return json_response(model_info(name, deps.routes_loaded_at))
