"""The operations of the OpenAPI document and of the real application, for comparing them,
and validators of the document's component schemas."""

from __future__ import annotations

from typing import Any

import jsonschema_rs
from aiohttp import web

Operation = tuple[str, str]  # (METHOD, path template), e.g. ("GET", "/v1/batches/{id}")

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

# Not part of the public API, so deliberately left out of the document and of the check:
# the browser panel under /panel (its pages and their assets), ``GET /`` (a redirect to
# it) and any static-file route.
UNDOCUMENTED_PREFIX = "/panel"
TO_PANEL = "/"


def is_undocumented(resource: web.AbstractResource) -> bool:
    """True for the routes the document leaves out on purpose (panel, static assets)."""
    path = resource.canonical
    in_panel = path in (TO_PANEL, UNDOCUMENTED_PREFIX) or path.startswith(UNDOCUMENTED_PREFIX + "/")
    return in_panel or isinstance(resource, web.StaticResource)


def registered_operations(app: web.Application) -> set[Operation]:
    """Every (method, path) ``app`` and its sub-applications route, HEAD and the
    undocumented routes left out."""
    found: set[Operation] = set()
    for resource in app.router.resources():
        for route in resource:  # a sub-application's resource yields its routes
            owner = route.resource
            if owner is None or is_undocumented(owner):
                continue
            if route.method != "HEAD":  # aiohttp adds HEAD to every GET
                found.add((route.method, owner.canonical))
    return found


def documented_operations(document: dict[str, Any]) -> set[Operation]:
    """Every (method, path) the document describes."""
    return {
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in item
        if method in HTTP_METHODS
    }


def component_validator(document: dict[str, Any], name: str) -> jsonschema_rs.Validator:
    """A JSON Schema 2020-12 validator (formats checked) of ``components/schemas/<name>``."""
    schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    return jsonschema_rs.Draft202012Validator(schema, validate_formats=True)
