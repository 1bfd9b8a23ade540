"""The e2e system: every service as its own OS process on a fresh database and namespace."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from relay_batches.services.relay_cli import admin
from tests.helpers.processes import System, build_system
from tests.helpers.support import ApiClient, WebhookReceiver, create_isolation, drop_isolation


@pytest.fixture(scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """One HTTP client session for the tests."""
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(scope="session")
async def system(output_dir: Path, http: aiohttp.ClientSession) -> AsyncIterator[System]:
    """The whole system, started once for the e2e session: one row-worker of 8 slots."""
    iso = await create_isolation("e2e")
    system = build_system(
        iso,
        output_dir / "e2e",
        RELAY_BATCH_CONCURRENCY="8",
        RELAY_DISPATCH_WINDOW="256",
    )
    try:
        await system.start_all(http)
        yield system
    finally:
        codes = system.stop_all()
        await drop_isolation(iso)
    assert all(code == 0 for code in codes.values()), f"unclean exits: {codes}"


@pytest.fixture(scope="session")
async def api_key(system: System) -> str:
    """A key of workspace A."""
    created = await admin.create_key(system.iso.database_url, "workspace-a")
    return created.key


@pytest.fixture(scope="session")
async def api(system: System, api_key: str, http: aiohttp.ClientSession) -> ApiClient:
    """A client of the running API, signed in to workspace A."""
    return ApiClient(system.api_url, api_key, http)


@pytest.fixture(scope="session")
async def webhooks() -> AsyncIterator[WebhookReceiver]:
    """A local webhook receiver for the session."""
    receiver = WebhookReceiver()
    await receiver.start()
    yield receiver
    await receiver.stop()
