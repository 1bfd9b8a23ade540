"""Chaos fixtures. The server-disruption test is collected only when asked for.

``RELAY_CHAOS_SERVERS=restart`` (``make chaos``) restarts the real RabbitMQ and
Postgres; ``RELAY_CHAOS_SERVERS=sever`` disrupts only the test's own connections.
Without the variable (``make test``, a bare ``pytest``) only the kill-only test runs,
so nobody restarts shared servers by accident.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.support import WebhookReceiver

SERVERS_MODE = os.environ.get("RELAY_CHAOS_SERVERS", "")
if SERVERS_MODE not in {"", "restart", "sever"}:
    raise pytest.UsageError(f"RELAY_CHAOS_SERVERS must be restart or sever, got {SERVERS_MODE!r}")

collect_ignore = [] if SERVERS_MODE else ["test_server_restarts.py"]

# Every chaos system: two row-workers, short leases and timeouts so recovery is quick.
CHAOS_ENV = {
    "RELAY_BATCH_CONCURRENCY": "4",
    "RELAY_DISPATCH_WINDOW": "256",
    "RELAY_LEASE_SECONDS": "3",
    "RELAY_STALL_SECONDS": "20",
    "RELAY_WEBHOOK_TIMEOUT_S": "5",
    "RELAY_SCHEDULER_MAX_SLEEP_S": "5",
}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """One HTTP client session."""
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def webhooks() -> AsyncIterator[WebhookReceiver]:
    """A webhook receiver for one chaos run."""
    receiver = WebhookReceiver()
    await receiver.start()
    yield receiver
    await receiver.stop()
