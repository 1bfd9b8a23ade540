"""The aggregator service running in-process over a real bus, for integration tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from relay_batches.bus.client import Bus
from relay_batches.kit.base import BusService
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.services.aggregator.core import Aggregator
from relay_batches.services.aggregator.service import aggregator_service
from tests.helpers.support import wait_until


@dataclass
class Aggregating:
    """A started aggregator service, the event that stops it and its task."""

    service: BusService
    stop: asyncio.Event
    task: asyncio.Task[None]


async def always_ready() -> bool:
    """A ledger that is always ready."""
    return True


async def start_aggregating(
    bus: Bus,
    store: OutcomeStore,
    *,
    chunk: int,
    outbox_every_s: float,
    grace_s: float,
    what: str = "the aggregator",
) -> Aggregating:
    """Start the aggregator service (prefetch 16, the ledger always ready) over ``bus`` and
    ``store``; return once it consumes."""
    service = aggregator_service(
        bus,
        Aggregator(store, bus.publish_event),
        always_ready,
        prefetch=16,
        chunk=chunk,
        outbox_every_s=outbox_every_s,
        grace_s=grace_s,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    await wait_until(service.ready, 10, f"{what} to consume")
    return Aggregating(service, stop, task)
