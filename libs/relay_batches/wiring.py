"""Opening a service's connections from settings, each closed by the service's exit stack."""

from __future__ import annotations

import contextlib

import asyncpg

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import Names
from relay_batches.ids import new_id
from relay_batches.ledger.pool import create_pool
from relay_batches.settings import Settings, pool_bounds


async def open_pool(
    settings: Settings, resources: contextlib.AsyncExitStack, max_size: int
) -> asyncpg.Pool:
    """A ledger pool of at most ``max_size`` connections (``RELAY_DB_POOL_MAX_SIZE``
    overrides it), closed when ``resources`` unwinds."""
    min_size, max_size = pool_bounds(settings, max_size)
    pool = await create_pool(
        settings.database_url,
        min_size=min_size,
        max_size=max_size,
        statement_cache_size=settings.db_statement_cache_size,
    )
    resources.push_async_callback(pool.close)
    return pool


def bus_names(settings: Settings) -> Names:
    """The bus names and queue arguments of a namespace, from the settings."""
    return Names(
        settings.namespace,
        settings.results_dead_max_length,
        queue_type=settings.queue_type,
        shards=settings.results_shards,
    )


async def open_bus(settings: Settings, resources: contextlib.AsyncExitStack, service: str) -> Bus:
    """A connected bus (topology declared) named ``<service>-<random>``, closed on unwind."""
    bus = Bus(
        settings.amqp_url,
        bus_names(settings),
        f"{service}-{new_id()[:8]}",
    )
    await bus.connect()
    resources.push_async_callback(bus.close)
    return bus
