"""The OpenAPI 3.1 document of the public API, served at ``GET /openapi.json``.

The document is built from one fragment per surface (native, OpenAI, Anthropic): each
surface declares its paths in Python and its schemas as pydantic models, the very models
that validate its requests where there are some (:func:`model_schemas`), so a shape is
written once and no schema file is kept by hand. Two tests keep the whole honest:
every route the application registers is documented (and the other way round), and
schemathesis drives a live ingest-api from it, checking every response against it.

:func:`documents` cuts the whole into one document per surface (its paths and only the
components they use), for the docs site's page of each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import (
    DefsRef,
    GenerateJsonSchema,
    JsonSchemaKeyT,
    JsonSchemaMode,
    JsonSchemaValue,
    models_json_schema,
)
from pydantic_core import CoreSchema, core_schema

from relay_batches.dialects.chat import Message, Params, RequestRow
from relay_batches.services.ingest_api.surfaces import anthropic, openai
from relay_batches.services.ingest_api.surfaces.anthropic import openapi as anthropic_openapi
from relay_batches.services.ingest_api.surfaces.native import document as native_document
from relay_batches.services.ingest_api.surfaces.native import openapi as native_openapi
from relay_batches.services.ingest_api.surfaces.openai.openapi import openai_fragment

DOCUMENT_PATH = "/openapi.json"


REF_TEMPLATE = "#/components/schemas/{model}"

# Each surface's fragment: ``{"paths": {...}, "schemas": {...}}``, and the native one's
# shared ``parameters`` and ``responses`` (see merge_fragment).
Fragment = Mapping[str, Mapping[str, Any]]
FRAGMENTS: tuple[Callable[[], Fragment], ...] = (
    lambda: {"schemas": model_schemas(RequestRow, Message, Params)},  # the stored chat row
    native_openapi.native_fragment,  # /v1 and the service endpoints
    openai_fragment,  # /openai/v1: files and batches
    anthropic_openapi.anthropic_fragment,  # /anthropic/v1/messages/batches
)


def model_schemas(
    *models: type[BaseModel],
    mode: str = "validation",
    generator: type[GenerateJsonSchema] = GenerateJsonSchema,
) -> dict[str, dict[str, Any]]:
    """The JSON Schemas of ``models`` and every model they use, by name, for
    ``components.schemas`` (their ``$ref``s point there). ``mode`` is pydantic's:
    ``validation`` for what a request may send, ``serialization`` for a response.
    A model whose name starts with ``_`` is a part of another: inlined where it is used."""
    _, top = models_json_schema(
        [(m, mode) for m in models],  # type: ignore[misc]
        ref_template=REF_TEMPLATE,
        schema_generator=generator,
    )
    schemas: dict[str, dict[str, Any]] = top.get("$defs", {})
    parts = {name: schemas.pop(name) for name in list(schemas) if name.startswith("_")}
    inlined: dict[str, dict[str, Any]] = _inline(schemas, parts)
    return inlined


def _inline(value: Any, parts: Mapping[str, Any]) -> Any:
    """``value`` with every ``$ref`` to one of ``parts`` replaced by the part itself (its
    other keys, a description, kept over the part's)."""
    if isinstance(value, list):
        return [_inline(item, parts) for item in value]
    if not isinstance(value, dict):
        return value
    found = {key: _inline(item, parts) for key, item in value.items()}
    name = str(found.get("$ref", "")).rpartition("/")[2]
    if name in parts:
        del found["$ref"]
        return {**_inline(parts[name], parts), **found}
    return found


class FlatNullable(GenerateJsonSchema):
    """Schemas as an OpenAPI reader expects them: no titles, no ``default: null``, and an
    optional scalar flat (``{"type": ["string", "null"], "maxLength": 256}``, so that its
    bounds are where a reader looks) rather than pydantic's ``anyOf`` of two schemas."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        """Never a title: the property's name is its title."""
        return False

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        """A scalar or an enum that may also be null, flat; anything else as pydantic has it."""
        inner = self.generate_inner(schema["schema"])
        if "enum" in inner:
            return {**inner, "enum": [*inner["enum"], None]}
        kind = inner.get("type")
        if isinstance(kind, str) and kind not in ("object", "array"):
            return {**inner, "type": [kind, "null"]}
        return super().nullable_schema(schema)

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        """A field that may be absent: no ``default`` when that default is null."""
        found = super().default_schema(schema)
        if "default" in found and found["default"] is None:
            del found["default"]
        return found

    def generate_definitions(
        self, inputs: Sequence[tuple[JsonSchemaKeyT, JsonSchemaMode, CoreSchema]]
    ) -> tuple[
        dict[tuple[JsonSchemaKeyT, JsonSchemaMode], JsonSchemaValue],
        dict[DefsRef, JsonSchemaValue],
    ]:
        """The definitions without the titles pydantic gives models, and each description
        (a docstring) on one line."""
        found, definitions = super().generate_definitions(inputs)
        _untitle(definitions)
        return found, definitions


def inline_schema(model: type[BaseModel], mode: JsonSchemaMode = "serialization") -> dict[str, Any]:
    """The schema of ``model`` (which uses no other model) to write in place, as
    :class:`FlatNullable` makes them."""
    schema: dict[str, Any] = model.model_json_schema(mode=mode, schema_generator=FlatNullable)
    _untitle(schema)
    return schema


def _untitle(value: Any) -> None:
    if isinstance(value, list):
        for item in value:
            _untitle(item)
    elif isinstance(value, dict):
        if isinstance(value.get("title"), str):
            del value["title"]
        if isinstance(value.get("description"), str):
            value["description"] = " ".join(value["description"].split())
        for item in value.values():
            _untitle(item)


def merge_fragment(document: dict[str, Any], fragment: Fragment) -> None:
    """Add a surface's paths and components to ``document``; a name defined twice (by two
    surfaces) is a programming error, raised at start-up."""
    components = document["components"]
    for key in ("paths", "schemas", "parameters", "responses"):
        target = document["paths"] if key == "paths" else components.setdefault(key, {})
        for name, value in fragment.get(key, {}).items():
            if name in target and target[name] != value:
                raise ValueError(f"OpenAPI {key} {name!r} is defined twice")
            target[name] = value


@cache
def document_bytes() -> bytes:
    """The document as served: the native surface's head with every surface's fragment
    merged, compacted (built once per process)."""
    document = native_document.head()
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
    """Register ``GET /openapi.json`` on ``app`` (the document is built here, at start-up)."""
    document_bytes()
    app.router.add_get(DOCUMENT_PATH, serve_document)


# What each surface's own document says of itself; the native one keeps the head's.
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
    the package's models, so the docs generator calls it without a server.
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
