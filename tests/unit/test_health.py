"""The service endpoints' contract as docs/api/index.md documents it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from relay_batches.health import add_health_routes


@pytest.fixture
async def service() -> AsyncIterator[tuple[TestClient, list[bool]]]:
    """A health port whose readiness the test switches."""
    up = [True]

    async def ready() -> bool:
        return up[0]

    app = web.Application()
    add_health_routes(app, ready)
    async with TestClient(TestServer(app)) as client:
        yield client, up


async def test_readyz_is_503_not_ready_while_a_dependency_is_down(
    service: tuple[TestClient, list[bool]],
) -> None:
    client, up = service
    response = await client.get("/readyz")
    assert (response.status, await response.json()) == (200, {"status": "ready"})
    up[0] = False
    response = await client.get("/readyz")
    assert (response.status, await response.json()) == (503, {"status": "not_ready"})
    response = await client.get("/healthz")  # alive all the same
    assert (response.status, await response.json()) == (200, {"status": "ok"})
