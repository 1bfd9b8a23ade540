"""``relay-scheduler``: read settings, open the pool and bus, run the spawn loop, the
expiry reaper and the retention reaper."""

from __future__ import annotations

import contextlib
import functools
import logging

from relay_batches.announce import wake_dispatcher
from relay_batches.ledger.expiry import ExpiryStore
from relay_batches.ledger.outbox import mark_finished_published
from relay_batches.ledger.retention import RetentionStore
from relay_batches.ledger.schedule import ScheduleStore, SpawnedRun
from relay_batches.ledger.schema import ledger_readiness
from relay_batches.runtime import Service, run_service
from relay_batches.services.scheduler.core import Reaper, Scheduler
from relay_batches.services.scheduler.retention import Purger
from relay_batches.services.scheduler.service import scheduler_service
from relay_batches.settings import Settings
from relay_batches.usage import answer_help
from relay_batches.wiring import open_bus, open_pool


async def build(
    settings: Settings, log: logging.Logger, resources: contextlib.AsyncExitStack
) -> Service:
    """Build the scheduler from settings."""
    pool = await open_pool(settings, resources, max_size=2)
    bus = await open_bus(settings, resources, "scheduler")

    async def wake(run: SpawnedRun) -> None:
        await wake_dispatcher(bus, run.id, run.priority)

    scheduler = Scheduler(ScheduleStore(pool), wake)
    reaper = Reaper(
        ExpiryStore(pool), bus.publish_event, functools.partial(mark_finished_published, pool)
    )
    return scheduler_service(
        bus,
        scheduler,
        ledger_readiness(pool),
        max_sleep_s=settings.scheduler_max_sleep_s,
        grace_s=settings.shutdown_grace_s,
        reaper=reaper,
        expiry_interval_s=settings.expiry_interval_s,
        purger=Purger(RetentionStore(pool, settings.retention)),
        retention_interval_s=settings.retention_interval_s,
    )


def main() -> None:
    """Console entry point."""
    answer_help(
        "relay-scheduler",
        "Spawns one queued run per due cron tick of each template and ends jobs past"
        " their completion window; purges ended jobs past their retention.",
    )
    run_service("scheduler", build)


if __name__ == "__main__":
    main()
