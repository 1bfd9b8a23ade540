"""The OpenAPI 3.1 document of the public API, served at ``GET /openapi.json``.

The document is the committed file ``openapi.json`` beside this module (shipped as package
data, the native API as first written by hand), merged with one fragment per surface
written since: each surface declares its paths in Python and its schemas as the very
pydantic models that validate its requests and build its responses
(:func:`model_schemas`), so a shape is written once. Two tests keep the whole honest:
every route the application registers is documented (and the other way round), and
schemathesis drives a live ingest-api from it, checking every response against it.

:func:`documents` cuts the whole into one document per surface (its paths and only the
components they use), for the docs site's page of each.
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
from relay_batches.services.ingest_api.surfaces import anthropic, openai
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


# What each surface's own document says of itself; the native one keeps the file's.
_SURFACE_INFO = {
    "openai": (
        "Relay Batches: OpenAI-compatible surface",
        "OpenAI's Files and Batch APIs under `/openai/v1`, for the official SDK: upload a"
        " `.jsonl` batch file, create a batch over it, read its output and error files."
        " Errors are OpenAI's error object.",
    ),
    "anthropic": (
        "Relay Batches: Anthropic-compatible surface",
        "Anthropic's Message Batches API under `/anthropic/v1`, for the official SDK."
        " Errors are Anthropic's error object.",
    ),
}


def documents() -> dict[str, dict[str, Any]]:
    """Each surface's own OpenAPI 3.1 document: ``native``, ``openai`` and ``anthropic``.

    Each holds the paths under its surface's prefix (``native``: every other path, the
    service endpoints included) and only the components they reach; nothing is read but
    the package's files, so the docs generator calls it without a server.
    """
    whole = load_document()
    prefixes = {"openai": f"{openai.PREFIX}/", "anthropic": f"{anthropic.PREFIX}/"}

    def surface_of(path: str) -> str:
        return next((name for name, p in prefixes.items() if path.startswith(p)), "native")

    found: dict[str, dict[str, Any]] = {}
    for name in ("native", "openai", "anthropic"):
        paths = {k: v for k, v in whole["paths"].items() if surface_of(k) == name}
        found[name] = _document_of(whole, paths, _SURFACE_INFO.get(name))
    return found


def _document_of(
    whole: dict[str, Any], paths: dict[str, Any], info: tuple[str, str] | None
) -> dict[str, Any]:
    """``whole`` cut down to ``paths``, the components they reach and the tags they use."""
    components = whole["components"]
    kept: dict[str, dict[str, Any]] = {}
    pending = _refs(paths)
    while pending:
        section, name = pending.pop()
        if name in kept.setdefault(section, {}):
            continue
        kept[section][name] = components[section][name]
        pending |= _refs(components[section][name])
    schemes = {n for op in _operations(paths) for need in op.get("security", []) for n in need}
    if schemes:
        kept["securitySchemes"] = {n: components["securitySchemes"][n] for n in sorted(schemes)}
    tags = {t for op in _operations(paths) for t in op.get("tags", [])}
    document: dict[str, Any] = {
        "openapi": whole["openapi"],
        "info": dict(whole["info"]),
        "tags": [t for t in whole.get("tags", []) if t["name"] in tags],
        "paths": paths,
        "components": {k: dict(sorted(v.items())) for k, v in sorted(kept.items())},
    }
    if info is not None:
        document["info"].update(title=info[0], description=info[1])
    if not document["tags"]:
        del document["tags"]
    return document


def _operations(paths: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for item in paths.values() for op in item.values() if isinstance(op, dict)]


def _refs(value: object) -> set[tuple[str, str]]:
    """Every ``#/components/<section>/<name>`` that ``value`` refers to, at any depth."""
    found: set[tuple[str, str]] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/"):
                section, _, name = ref.removeprefix("#/components/").partition("/")
                found.add((section, name))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found
