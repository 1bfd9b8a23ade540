"""``relay-scheduler``: read settings, open the pool and bus, run."""

from __future__ import annotations

import contextlib
import logging

from relay.ledger.pool import database_ready
from relay.runtime import Service, run_service
from relay.settings import Settings
from relay.wiring import open_bus, open_pool
from scheduler.service import SchedulerService


async def build(
    settings: Settings, log: logging.Logger, resources: contextlib.AsyncExitStack
) -> Service:
    """Build the scheduler from settings."""
    pool = await open_pool(settings, resources, max_size=2)
    bus = await open_bus(settings, resources, "scheduler")
    return SchedulerService(bus, lambda: database_ready(pool))


def main() -> None:
    """Console entry point."""
    run_service("scheduler", build)


if __name__ == "__main__":
    main()
