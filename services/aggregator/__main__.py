"""``relay-aggregator``: read settings, open the pool and bus, run the chunk loop."""

from __future__ import annotations

import contextlib
import logging

from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.ledger.schema import ledger_readiness
from relay_batches.runtime import Service, run_service
from relay_batches.services.aggregator.core import Aggregator
from relay_batches.services.aggregator.service import aggregator_service
from relay_batches.settings import Settings
from relay_batches.usage import answer_help
from relay_batches.wiring import open_bus, open_pool


async def build(
    settings: Settings, log: logging.Logger, resources: contextlib.AsyncExitStack
) -> Service:
    """Build the aggregator from settings."""
    pool = await open_pool(settings, resources, max_size=4)
    bus = await open_bus(settings, resources, "aggregator")
    aggregator = Aggregator(OutcomeStore(pool), bus.publish_event)
    return aggregator_service(
        bus,
        aggregator,
        ledger_readiness(pool),
        prefetch=settings.aggregator_prefetch,
        chunk=settings.aggregator_chunk,
        outbox_every_s=settings.reconcile_seconds,
        grace_s=settings.shutdown_grace_s,
        linger_s=settings.aggregator_linger_ms / 1000,
        chunk_bytes=settings.aggregator_chunk_bytes,
        chunk_max=settings.aggregator_chunk_max,
        shards=settings.aggregator_shards,
    )


def main() -> None:
    """Console entry point."""
    answer_help("relay-aggregator", "Records row outcomes, moves counters and finishes jobs.")
    run_service("aggregator", build)


if __name__ == "__main__":
    main()
