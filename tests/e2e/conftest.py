"""The e2e system: every service as its own OS process on a fresh database and namespace."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from relay_batches.services.relay_cli import admin
from tests.helpers.panel_browser import browser, page, panel_key, shots  # noqa: F401 (fixtures)
from tests.helpers.processes import System, running_system
from tests.helpers.support import (
    ApiClient,
    Isolation,
    WebhookReceiver,
    create_isolation,
    drop_isolation,
)


@pytest.fixture(scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """One HTTP client session for the tests."""
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(scope="session")
async def system(output_dir: Path, http: aiohttp.ClientSession) -> AsyncIterator[System]:
    """The whole system, started once for the e2e session: one row-worker of 8 slots."""
    async with running_system(
        "e2e", output_dir / "e2e", http, RELAY_BATCH_CONCURRENCY="8", RELAY_DISPATCH_WINDOW="256"
    ) as system:
        yield system


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
    async with WebhookReceiver() as receiver:
        yield receiver


@pytest.fixture
async def isolation() -> AsyncIterator[Isolation]:
    """A database and namespace of the test's own (no other service consumes them)."""
    iso = await create_isolation("dev")
    yield iso
    await drop_isolation(iso)
