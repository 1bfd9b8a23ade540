"""The ingest-api application in-process on a real loopback port, as integration tests use it."""

from __future__ import annotations

import asyncpg
from aiohttp.test_utils import TestServer

from relay_batches.bus.client import Bus
from relay_batches.ledger.idempotency import IdempotencyStore
from relay_batches.ledger.jobs import JobStore
from relay_batches.ledger.keys import KeyStore
from relay_batches.router.aliases import AliasTable, parse_aliases
from relay_batches.services.ingest_api.app import build_app
from relay_batches.services.ingest_api.deps import ApiDeps
from relay_batches.services.ingest_api.publishing import publisher_for
from relay_batches.services.ingest_api.validation import SubmitLimits

TEST_LIMITS = SubmitLimits(max_rows=50, max_content_bytes=1024)
TEST_MAX_BODY = 256 * 1024


def test_aliases() -> AliasTable:
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


test_aliases.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


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
