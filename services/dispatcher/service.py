"""The dispatcher: wake-ups, progress events of its own jobs (``job.progress.<owner>``,
and broadcast ``job.progress``: a pause), cancel events (a cancel, or an expiry: status
``expired``), and a reconcile timer.

Messages are wake-ups; the ledger is the truth. A missed wake-up or progress event only
delays work until the next reconcile pass, which claims queued and orphaned jobs, renews
leases (topping up every window on the way) and re-publishes the unfinished rows of
jobs that made no progress for the stall timeout, unless a live row-worker holds them
(``worker.holding`` heartbeats, see :mod:`.inflight`). On stop the leases are handed back,
so another dispatcher takes the jobs over at once.
"""

from __future__ import annotations

from relay_batches.bus.topology import (
    EVENT_CANCELED,
    EVENT_HOLDING,
    EVENT_PROGRESS,
    progress_key,
)
from relay_batches.kit.base import BusService, ReadyCheck, ServiceBus
from relay_batches.kit.consumer import Consume, Subscribe
from relay_batches.kit.periodic import Periodic, every
from relay_batches.messages import DispatchWakeup, HoldingReport, JobEvent
from relay_batches.services.dispatcher.core import Dispatcher

DISPATCH_PREFETCH = 4


def dispatcher_service(
    bus: ServiceBus,
    dispatcher: Dispatcher,
    ledger: ReadyCheck,
    *,
    reconcile_s: float,
    grace_s: float,
    statistics: Periodic | None = None,
    backlog: Periodic | None = None,
) -> BusService:
    """The dispatcher's declaration; ``statistics``: the statistics keeper's periodic
    pass (:mod:`relay_batches.ledger.statistics`), ``backlog``: the backlog gauges' (see
    :mod:`.backlog`), each if it runs."""

    async def on_canceled(event: JobEvent) -> None:
        await dispatcher.drop(event.batch_id)

    # Progress of our own jobs only (``job.progress.<owner>``: CPU per row stays flat
    # however many dispatchers run), and the broadcast ``job.progress`` that a pause
    # (ingest-api knows no owner) and an older aggregator publish.
    events = Subscribe(
        {
            progress_key(dispatcher.owner): dispatcher.on_progress,
            EVENT_PROGRESS: dispatcher.on_progress,
            EVENT_CANCELED: on_canceled,
        },
        JobEvent.decode,
    )
    heartbeats = Subscribe(
        {EVENT_HOLDING: dispatcher.inflight.on_report},
        HoldingReport.decode,
        kind="holding",
    )
    wakeups = Consume(
        bus.names.dispatch,
        "dispatch",
        DispatchWakeup.decode,
        lambda _: dispatcher.claim(),
        DISPATCH_PREFETCH,
    )
    return BusService(
        bus,
        [events, heartbeats, wakeups],
        periodic=[
            every("reconcile", reconcile_s, dispatcher.reconcile),
            *(task for task in (statistics, backlog) if task is not None),
        ],
        ledger=ledger,
        grace_s=grace_s,
        stopping=dispatcher.stop_claiming,
        close=dispatcher.hand_back,
    )
