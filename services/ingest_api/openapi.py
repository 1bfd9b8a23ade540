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

from relay_batches.services.ingest_api import anthropic_openapi, chat_rows
from relay_batches.services.ingest_api.openai_openapi import openai_fragment

DOCUMENT_PATH = "/openapi.json"
_RESOURCE = "openapi.json"


REF_TEMPLATE = "#/components/schemas/{model}"

# Each surface's fragment: ``{"paths": {...}, "schemas": {...}}`` (see merge_fragment).
Fragment = Mapping[str, Mapping[str, Any]]
FRAGMENTS: tuple[Callable[[], Fragment], ...] = (
    chat_rows.openapi_fragment,  # RequestRow, Message, Params
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


# Each surface's paths start with its prefix; the rest (/v1, the service endpoints) are the
# native surface's.
SURFACE_PREFIXES = {"openai": "/openai/v1/", "anthropic": "/anthropic/v1/"}


def documents() -> dict[str, dict[str, Any]]:
    """Each surface's own OpenAPI document, by name (``native``, ``openai``,
    ``anthropic``): the served document's paths split by prefix, each document holding
    only the components and tags its paths use. The docs' API reference pages are
    generated from these."""
    whole = load_document()
    split: dict[str, dict[str, Any]] = {name: {} for name in ("native", *SURFACE_PREFIXES)}
    for path, item in whole["paths"].items():
        name = next((n for n, p in SURFACE_PREFIXES.items() if path.startswith(p)), "native")
        split[name][path] = item
    return {name: _surface_document(whole, paths) for name, paths in split.items()}


def _surface_document(whole: dict[str, Any], paths: dict[str, Any]) -> dict[str, Any]:
    """``whole`` cut down to ``paths`` and what they use."""
    used = _references(whole["components"], paths)
    components = {
        kind: {
            name: value
            for name, value in entries.items()
            if kind == "securitySchemes" or f"#/components/{kind}/{name}" in used
        }
        for kind, entries in whole["components"].items()
    }
    tags = {
        tag
        for item in paths.values()
        for operation in item.values()
        if isinstance(operation, dict)
        for tag in operation.get("tags", ())
    }
    return {
        **whole,
        "paths": paths,
        "components": components,
        "tags": [tag for tag in whole.get("tags", ()) if tag["name"] in tags],
    }


def _references(components: dict[str, Any], root: object) -> set[str]:
    """Every ``#/components/...`` reference reachable from ``root``, transitively."""
    seen: set[str] = set()
    stack: list[object] = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/") and ref not in seen:
                seen.add(ref)
                _, _, kind, name = ref.split("/", 3)
                stack.append(components[kind][name])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return seen
