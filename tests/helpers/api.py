"""The ingest-api application in-process on a real loopback port, as integration tests use it."""

from __future__ import annotations

from typing import Any

import asyncpg
from aiohttp.test_utils import TestServer
from aiohttp.web_runner import BaseRunner

from relay_batches.bus.client import Bus
from relay_batches.ledger.files import FileStore
from relay_batches.ledger.idempotency import IdempotencyStore
from relay_batches.ledger.jobs import JobStore
from relay_batches.ledger.keys import KeyStore
from relay_batches.router.aliases import AliasTable, parse_aliases
from relay_batches.services.ingest_api.app import build_app
from relay_batches.services.ingest_api.deps import ApiDeps
from relay_batches.services.ingest_api.edge.body import BodyGate
from relay_batches.services.ingest_api.edge.protocol import ApiRunner
from relay_batches.services.ingest_api.publishing import publisher_for
from relay_batches.services.ingest_api.rows.validation import (
    SubmitLimits,
)

TEST_LIMITS = SubmitLimits(max_rows=50, max_content_bytes=1024, max_row_bytes=160 * 1024)
TEST_MAX_BODY = 1024 * 1024  # uploads, and OpenAI files
TEST_MAX_JSON_BODY = 192 * 1024  # JSON bodies, decoded in memory
TEST_READ_TIMEOUT_S = 3.0  # a stalled body is answered 408 after this long
TEST_LARGE_BODY = 64 * 1024  # bodies over this hold one of TEST_LARGE_SLOTS slots
TEST_LARGE_SLOTS = 2
TEST_MIN_RATE = 256.0  # bytes/s a body must average once TEST_READ_TIMEOUT_S has passed


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


class ApiTestServer(TestServer):
    """aiohttp's test server on the API's own runner (:class:`ApiRunner`)."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return ApiRunner(self.app, **kwargs)


async def start_api(
    pool: asyncpg.Pool,
    bus: Bus,
    aliases: AliasTable,
    jobs: JobStore,
    public_base_url: str = "",
    **runner_args: Any,
) -> TestServer:
    """Start the ingest-api application, on ``jobs``, on a real loopback port
    (``runner_args`` go to its :class:`ApiRunner`)."""
    deps = ApiDeps(
        jobs=jobs,
        idempotency=IdempotencyStore(pool),
        announcer=publisher_for(bus, jobs),
        model_known=lambda alias: aliases.resolve(alias) is not None,
        limits=TEST_LIMITS,
        max_body_bytes=TEST_MAX_BODY,
        max_json_body_bytes=TEST_MAX_JSON_BODY,
        files=FileStore(pool, jobs.long_stores),
        pool=pool,
        model_names=aliases.names,
        aliases=aliases,
        public_base_url=public_base_url,
        body_gate=BodyGate(TEST_READ_TIMEOUT_S, TEST_LARGE_BODY, TEST_LARGE_SLOTS, TEST_MIN_RATE),
    )

    async def ready() -> bool:
        return True

    server = ApiTestServer(build_app(deps, KeyStore(pool).workspace_for_key, ready))
    await server.start_server(**runner_args)
    return server
