"""The scheduler: spawn what is due, then sleep until the next tick (or a wake-up).

The sleep lasts until the earliest ``next_run_at`` in the ledger (by the database's
clock), capped (a template
created by an older ingest-api, or a wake-up lost while disconnected, is at most one
cap late), and ends early when a ``template.created`` event arrives. A failed pass
(database away) is retried after a short pause.

Beside it runs the reaper (:class:`~.core.Reaper`): every ``expiry_interval_s`` it ends
the jobs whose completion window has passed; and the retention reaper
(:class:`~.retention.Purger`): every ``retention_interval_s`` it purges the ended jobs
past their retention.
"""

from __future__ import annotations

import logging

from relay_batches.bus.topology import EVENT_TEMPLATE_CREATED
from relay_batches.kit.base import BusService, ReadyCheck, ServiceBus
from relay_batches.kit.consumer import Subscribe
from relay_batches.kit.periodic import Periodic, every
from relay_batches.messages import TemplateCreated
from relay_batches.services.scheduler.core import Clock, Reaper, Scheduler, utc_now
from relay_batches.services.scheduler.retention import Purger

log = logging.getLogger("relay.scheduler")

RETRY_PAUSE_S = 1.0
EVENTS_PREFETCH = 16


def scheduler_service(
    bus: ServiceBus,
    scheduler: Scheduler,
    ledger: ReadyCheck,
    *,
    max_sleep_s: float,
    grace_s: float,
    clock: Clock = utc_now,
    reaper: Reaper | None = None,
    expiry_interval_s: float = 1.0,
    purger: Purger | None = None,
    retention_interval_s: float = 60.0,
) -> BusService:
    """The scheduler's declaration; with a ``reaper``, its expiry pass too; with a
    ``purger``, its retention pass too."""
    spawn = Periodic(
        "spawn",
        max_sleep_s,
        lambda: scheduler.spawn_pass(clock, max_sleep_s),
        after_error_s=RETRY_PAUSE_S,
    )

    async def on_created(created: TemplateCreated) -> None:
        log.info("template_created", extra={"template_id": created.template_id})
        spawn.wake.set()

    created = Subscribe(
        {EVENT_TEMPLATE_CREATED: on_created},
        TemplateCreated.decode,
        kind="template",
        prefetch=EVENTS_PREFETCH,
    )
    periodic = [spawn]
    if reaper is not None:
        periodic.append(every("expire", expiry_interval_s, reaper.expire_pass))
    if purger is not None:
        periodic.append(every("retention", retention_interval_s, purger.purge_pass))
    return BusService(bus, [created], periodic=periodic, ledger=ledger, grace_s=grace_s)
