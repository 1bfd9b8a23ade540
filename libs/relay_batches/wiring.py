"""Opening a service's connections from settings, each closed by the service's exit stack."""

from __future__ import annotations

import contextlib

import asyncpg

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import Names
from relay_batches.ids import new_id
from relay_batches.ledger.pool import create_pool
from relay_batches.settings import Settings


async def open_pool(
    settings: Settings, resources: contextlib.AsyncExitStack, max_size: int
) -> asyncpg.Pool:
    """A ledger pool, closed when ``resources`` unwinds."""
    pool = await create_pool(settings.database_url, max_size=max_size)
    resources.push_async_callback(pool.close)
    return pool


def bus_names(settings: Settings) -> Names:
    """The bus names of ``settings``' namespace, with its queue-shaping settings."""
    return Names(settings.namespace, settings.results_dead_max_length, settings.results_shards)


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
