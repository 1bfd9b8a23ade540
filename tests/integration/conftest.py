"""Integration fixtures: a fresh database and bus namespace, and the ingest-api in-process
on a real port, wired to the real Postgres and RabbitMQ."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestServer

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import Names
from relay_batches.kit.base import BusService
from relay_batches.ledger.jobs import JobStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.ledger.pool import create_pool
from relay_batches.router.aliases import AliasTable
from relay_batches.services.relay_cli import admin
from tests.helpers.aggregating import start_aggregating
from tests.helpers.api import start_api, test_aliases
from tests.helpers.support import (
    AMQP_URL,
    ApiClient,
    Isolation,
    create_isolation,
    drop_isolation,
)


@pytest.fixture(scope="session")
async def iso() -> AsyncIterator[Isolation]:
    """This session's own database and namespace."""
    created = await create_isolation("int")
    yield created
    await drop_isolation(created)


@pytest.fixture(scope="session")
async def pool(iso: Isolation) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the session database."""
    created = await create_pool(iso.database_url, max_size=5)
    yield created
    await created.close()


@pytest.fixture(scope="session")
async def bus(iso: Isolation) -> AsyncIterator[Bus]:
    """A connected bus in the session namespace (topology declared)."""
    created = Bus(AMQP_URL, Names(iso.namespace), "integration-tests")
    await created.connect()
    yield created
    await created.close()


@pytest.fixture(scope="session")
def aliases() -> AliasTable:
    """An alias table with the alias the tests use (the URL is never called by the API)."""
    return test_aliases()


@pytest.fixture(scope="session")
async def api_server(
    pool: asyncpg.Pool, bus: Bus, aliases: AliasTable
) -> AsyncIterator[TestServer]:
    """The ingest-api application on a real loopback port."""
    server = await start_api(pool, bus, aliases, JobStore(pool))
    yield server
    await server.close()


@pytest.fixture(scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """One HTTP client session."""
    async with aiohttp.ClientSession() as session:
        yield session


async def _client(
    iso: Isolation, server: TestServer, http: aiohttp.ClientSession, workspace: str
) -> ApiClient:
    created = await admin.create_key(iso.database_url, workspace)
    return ApiClient(str(server.make_url("")).rstrip("/"), created.key, http)


@pytest.fixture(scope="session")
async def client_a(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession
) -> ApiClient:
    """A client signed in to workspace A."""
    return await _client(iso, api_server, http, "workspace-a")


@pytest.fixture(scope="session")
async def client_b(
    iso: Isolation, api_server: TestServer, http: aiohttp.ClientSession
) -> ApiClient:
    """A client signed in to workspace B."""
    return await _client(iso, api_server, http, "workspace-b")


@pytest.fixture
async def aggregator(pool: asyncpg.Pool, bus: Bus) -> AsyncIterator[BusService]:
    """The aggregator service consuming the real results queue."""
    running = await start_aggregating(
        bus, OutcomeStore(pool), chunk=8, outbox_every_s=0.2, grace_s=5
    )
    yield running.service
    running.stop.set()
    await asyncio.wait_for(running.task, 10)
