"""``relay-scheduler``: read settings, open the pool and bus, run the spawn loop."""

from __future__ import annotations

import contextlib
import logging

from relay.bus.topology import broker_priority
from relay.ledger.pool import database_ready
from relay.ledger.schedule import ScheduleStore, SpawnedRun
from relay.messages import DispatchWakeup
from relay.runtime import Service, run_service
from relay.settings import Settings
from relay.wiring import open_bus, open_pool
from scheduler.handlers import Scheduler
from scheduler.service import SchedulerService


async def build(
    settings: Settings, log: logging.Logger, resources: contextlib.AsyncExitStack
) -> Service:
    """Build the scheduler from settings."""
    pool = await open_pool(settings, resources, max_size=2)
    bus = await open_bus(settings, resources, "scheduler")

    async def wake_dispatcher(run: SpawnedRun) -> None:
        await bus.publish(
            bus.names.dispatch,
            DispatchWakeup(run.id, run.priority).encode(),
            kind="dispatch",
            priority=broker_priority(run.priority),
        )

    scheduler = Scheduler(ScheduleStore(pool), wake_dispatcher)
    return SchedulerService(
        bus, scheduler, lambda: database_ready(pool), settings.scheduler_max_sleep_s
    )


def main() -> None:
    """Console entry point."""
    run_service("scheduler", build)


if __name__ == "__main__":
    main()
