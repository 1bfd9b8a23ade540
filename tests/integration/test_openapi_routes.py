"""The OpenAPI document and the real application describe the same routes, and the
document is served without a key.

The application is the session's ``build_app(...)`` (real Postgres and RabbitMQ behind
it). Left out on purpose, on both sides: HEAD (aiohttp adds it to every GET), the browser
panel under ``/panel`` and static assets; see ``tests/openapi_ops.py``.
"""

from __future__ import annotations

import aiohttp
from aiohttp.test_utils import TestServer

from relay_batches.services.ingest_api.openapi import load_document
from tests.helpers.openapi_ops import (
    documented_operations,
    registered_operations,
)


def _listing(operations: set[tuple[str, str]]) -> str:
    return ", ".join(f"{method} {path}" for method, path in sorted(operations, key=lambda o: o[1]))


def test_every_registered_route_is_documented(api_server: TestServer) -> None:
    missing = registered_operations(api_server.app) - documented_operations(load_document())

    assert not missing, f"routes of the app missing from the OpenAPI document: {_listing(missing)}"


def test_every_documented_operation_is_registered(api_server: TestServer) -> None:
    registered = registered_operations(api_server.app)
    unregistered = documented_operations(load_document()) - registered

    assert not unregistered, f"documented but not routed by the app: {_listing(unregistered)}"


def test_the_route_lists_are_not_empty(api_server: TestServer) -> None:
    # Guards the comparison itself: both sides really list the public API.
    both = registered_operations(api_server.app) & documented_operations(load_document())

    assert {("POST", "/v1/batches"), ("GET", "/v1/batches/{id}"), ("GET", "/healthz")} <= both


async def test_openapi_json_is_served_without_a_key(
    api_server: TestServer, http: aiohttp.ClientSession
) -> None:
    async with http.get(str(api_server.make_url("/openapi.json"))) as response:
        assert response.status == 200
        assert response.content_type == "application/json"
        served = await response.json()

    assert served == load_document()
    assert served["openapi"].startswith("3.1.")
