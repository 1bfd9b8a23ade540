"""The OpenAPI 3.1 document of the public API, served at ``GET /openapi.json``.

The document is the committed file ``openapi.json`` beside this module (shipped as package
data, the native API as first written by hand), merged with one fragment per surface
written since: each surface declares its paths in Python and its schemas as the very
pydantic models that validate its requests and build its responses
(:func:`model_schemas`), so a shape is written once. Two tests keep the whole honest:
every route the application registers is documented (and the other way round), and
schemathesis drives a live ingest-api from it, checking every response against it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cache
from importlib import resources
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from relay_batches.dialects.chat import Message, Params, RequestRow
from relay_batches.services.ingest_api.surfaces.anthropic import openapi as anthropic_openapi
from relay_batches.services.ingest_api.surfaces.openai.openapi import openai_fragment

DOCUMENT_PATH = "/openapi.json"
_RESOURCE = "openapi.json"


REF_TEMPLATE = "#/components/schemas/{model}"

# Each surface's fragment: ``{"paths": {...}, "schemas": {...}}`` (see merge_fragment).
Fragment = Mapping[str, Mapping[str, Any]]
FRAGMENTS: tuple[Callable[[], Fragment], ...] = (
    lambda: {"schemas": model_schemas(RequestRow, Message, Params)},  # the stored chat row
    openai_fragment,  # /openai/v1: files and batches
    anthropic_openapi.anthropic_fragment,  # /anthropic/v1/messages/batches
)


def model_schemas(*models: type[BaseModel], mode: str = "validation") -> dict[str, dict[str, Any]]:
    """The JSON Schemas of ``models`` and every model they use, by name, for
    ``components.schemas`` (their ``$ref``s point there). ``mode`` is pydantic's:
    ``validation`` for what a request may send, ``serialization`` for a response."""
    _, top = models_json_schema(
        [(m, mode) for m in models],  # type: ignore[misc]
        ref_template=REF_TEMPLATE,
    )
    schemas: dict[str, dict[str, Any]] = top.get("$defs", {})
    return schemas


def merge_fragment(document: dict[str, Any], fragment: Fragment) -> None:
    """Add a surface's paths and schemas to ``document``; a name defined twice (two
    surfaces, or a surface and the file) is a programming error, raised at start-up."""
    for key, target in (
        ("paths", document["paths"]),
        ("schemas", document["components"]["schemas"]),
    ):
        for name, value in fragment.get(key, {}).items():
            if name in target and target[name] != value:
                raise ValueError(f"OpenAPI {key} {name!r} is defined twice")
            target[name] = value


@cache
def document_bytes() -> bytes:
    """The document as served: the packaged file with every surface's fragment merged,
    compacted (built once per process)."""
    raw = resources.files("relay_batches.services.ingest_api").joinpath(_RESOURCE).read_bytes()
    document: dict[str, Any] = orjson.loads(raw)
    for fragment in FRAGMENTS:
        merge_fragment(document, fragment())
    return orjson.dumps(document)


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
