"""Integration fixtures: a fresh database and bus namespace, and the ingest-api in-process
on a real port, wired to the real Postgres and RabbitMQ."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestServer
from relay_batches.services.ingest_api.app import build_app
from relay_batches.services.ingest_api.deps import ApiDeps
from relay_batches.services.ingest_api.publishing import publisher_for
from relay_batches.services.ingest_api.validation import SubmitLimits
from relay_batches.services.relay_cli import admin

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import Names
from relay_batches.ledger.idempotency import IdempotencyStore
from relay_batches.ledger.jobs import JobStore
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.pool import create_pool
from relay_batches.router.aliases import AliasTable, parse_aliases
from tests.support import AMQP_URL, ApiClient, Isolation, create_isolation, drop_isolation

TEST_LIMITS = SubmitLimits(max_rows=50, max_content_bytes=1024)
TEST_MAX_BODY = 256 * 1024


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
    return parse_aliases(
        {
            "aliases": {"gpt-4o-mini": {"deployments": ["sim"]}},
            "deployments": {
                "sim": {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
            },
        },
        {},
    )


async def start_api(
    pool: asyncpg.Pool, bus: Bus, aliases: AliasTable, jobs: JobStore
) -> TestServer:
    """Start the ingest-api application, on ``jobs``, on a real loopback port."""
    deps = ApiDeps(
        jobs=jobs,
        idempotency=IdempotencyStore(pool),
        announcer=publisher_for(bus, jobs),
        model_known=lambda alias: aliases.resolve(alias) is not None,
        limits=TEST_LIMITS,
        max_body_bytes=TEST_MAX_BODY,
        model_names=aliases.names,
    )

    async def ready() -> bool:
        return True

    server = TestServer(build_app(deps, KeyStore(pool).workspace_for_key, ready))
    await server.start_server()
    return server


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
