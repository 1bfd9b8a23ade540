"""Chaos fixtures. The server-disruption tests are collected only when asked for.

``RELAY_CHAOS_SERVERS=restart`` (``make chaos``) restarts the real RabbitMQ and
Postgres; ``RELAY_CHAOS_SERVERS=sever`` disrupts only the test's own connections.
Without the variable (``make test``, a bare ``pytest``) only the kill-only tests run,
so nobody restarts shared servers by accident.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.chaos.settings import SERVERS_MODE
from tests.helpers.support import WebhookReceiver

collect_ignore = [] if SERVERS_MODE else ["test_server_restarts.py", "test_outages.py"]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """One HTTP client session."""
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def webhooks() -> AsyncIterator[WebhookReceiver]:
    """A webhook receiver for one chaos run."""
    async with WebhookReceiver() as receiver:
        yield receiver
