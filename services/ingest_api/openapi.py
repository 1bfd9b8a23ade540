"""The OpenAPI 3.1 document of the public API, served at ``GET /openapi.json``.

The document is the committed file ``openapi.json`` beside this module (shipped as package
data). Two tests keep it honest: every route the application registers is documented
(and the other way round), and schemathesis drives a live ingest-api from it, checking
every response against it.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import orjson
from aiohttp import web

DOCUMENT_PATH = "/openapi.json"
_RESOURCE = "openapi.json"


@cache
def document_bytes() -> bytes:
    """The document as served: the packaged file, compacted (read once per process)."""
    raw = resources.files("relay_batches.services.ingest_api").joinpath(_RESOURCE).read_bytes()
    return orjson.dumps(orjson.loads(raw))


def load_document() -> dict[str, Any]:
    """The document as a fresh dict (callers may change their copy)."""
    document: dict[str, Any] = orjson.loads(document_bytes())
    return document


async def serve_document(_: web.Request) -> web.Response:
    """``GET /openapi.json``: no authentication, like the other service endpoints."""
    return web.Response(body=document_bytes(), content_type="application/json")


def add_openapi_route(app: web.Application) -> None:
    """Register ``GET /openapi.json`` on ``app`` (the file is read here, at start-up)."""
    document_bytes()
    app.router.add_get(DOCUMENT_PATH, serve_document)
