"""``GET /v1/models``: the router's public aliases, and a container view of them."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from ingest_api.middleware import json_response
from ingest_api.routes import DEPS


class KnownModels:
    """``alias in KnownModels(pred)``: the router's aliases as a container for validation."""

    def __init__(self, known: Callable[[str], bool]) -> None:
        self._known = known

    def __contains__(self, alias: object) -> bool:
        return isinstance(alias, str) and self._known(alias)


def add_model_routes(app: web.Application) -> None:
    """Register ``GET /v1/models`` on ``app``."""
    app.router.add_get("/v1/models", list_models)


async def list_models(request: web.Request) -> web.Response:
    """``GET /v1/models``: ``{object: list, data: [{id, object: model}]}``, sorted by id."""
    names = sorted(request.app[DEPS].model_names())
    return json_response(
        {"object": "list", "data": [{"id": name, "object": "model"} for name in names]}
    )
