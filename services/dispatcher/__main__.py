"""``relay-dispatcher``: read settings, open the pool and bus, run the dispatch loop."""

from __future__ import annotations

import contextlib
import logging
import os

from relay_batches.announce import announce_finished
from relay_batches.bus.client import Bus
from relay_batches.bus.topology import EVENT_OVERTAKING, MAX_PRIORITY
from relay_batches.ids import new_id
from relay_batches.kit.periodic import every
from relay_batches.ledger.backlog import BacklogStore
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.outbox import mark_finished_published
from relay_batches.ledger.schema import ledger_readiness
from relay_batches.ledger.statistics import StatisticsKeeper
from relay_batches.messages import JobEvent, SliceMessage
from relay_batches.router.aliases import load_aliases
from relay_batches.runtime import Service, run_service
from relay_batches.services.dispatcher.backlog import backlog_pass
from relay_batches.services.dispatcher.budget import alias_price
from relay_batches.services.dispatcher.core import DispatchConfig, Dispatcher
from relay_batches.services.dispatcher.lanes import LanePlanner
from relay_batches.services.dispatcher.recording import ResultsQueues
from relay_batches.services.dispatcher.service import dispatcher_service
from relay_batches.settings import Settings
from relay_batches.usage import answer_help
from relay_batches.wiring import bus_names, open_pool


async def build(
    settings: Settings, log: logging.Logger, resources: contextlib.AsyncExitStack
) -> Service:
    """Build the dispatcher from settings."""
    aliases = load_aliases(settings.routes_file, os.environ)
    owner = f"dispatcher-{new_id()[:12]}"
    pool = await open_pool(settings, resources, max_size=4)
    bus = Bus(settings.amqp_url, bus_names(settings), owner)
    await bus.connect()
    resources.push_async_callback(bus.close)

    async def publish_slice(job_slice: SliceMessage, level: int, trace: str | None = None) -> None:
        await bus.publish(
            bus.names.rows, job_slice.encode(), kind="rows", priority=level, trace=trace
        )

    async def announce_failed(event: JobEvent) -> None:
        await announce_finished(
            bus.publish_event, lambda ids: mark_finished_published(pool, ids), [event]
        )

    config = DispatchConfig(
        owner=owner,
        window=settings.dispatch_window,
        slice_rows=settings.slice_rows,
        max_running_jobs=settings.max_running_jobs,
        lease_s=settings.lease_seconds,
        stall_s=settings.stall_seconds,
        max_running_per_workspace=settings.max_running_jobs_per_workspace,
        max_level=MAX_PRIORITY,
        window_bytes=settings.dispatch_window_bytes,
        window_max=settings.dispatch_window_max,
        window_max_bytes=settings.dispatch_window_max_bytes,
        paced=True,
        group_prefixes=settings.prefix_grouping == "on",
    )
    dispatcher = Dispatcher(
        DispatchStore(pool),
        publish_slice,
        announce_failed,
        lambda alias: aliases.resolve(alias) is not None,
        config,
        rows_waiting=lambda: bus.ready_count(bus.names.rows),
        results_state=lambda: results_state(bus),
        plan_lanes=LanePlanner(pool, aliases),
        price_of=lambda alias: alias_price(aliases, alias),
        connected=bus.ready,
        announce_overtaking=lambda event: bus.publish_event(EVENT_OVERTAKING, event.encode()),
    )
    bus.on_connection_lost(dispatcher.sight_lost)
    log.info("configured", extra={"owner": owner, "aliases": aliases.names()})
    return dispatcher_service(
        bus,
        dispatcher,
        ledger_readiness(pool),
        reconcile_s=settings.reconcile_seconds,
        grace_s=settings.shutdown_grace_s,
        statistics=(
            every("statistics", settings.statistics_seconds, StatisticsKeeper(pool).refresh)
            if settings.statistics_seconds > 0
            else None
        ),
        backlog=(
            backlog_pass(BacklogStore(pool), owner, settings.backlog_seconds)
            if settings.backlog_seconds > 0
            else None
        ),
    )


async def results_state(bus: Bus) -> ResultsQueues:
    """``(ready, consumers)`` of the unsharded results queue and of each results shard
    (passive declares, on a channel apart from the publisher's)."""
    names = bus.names
    unsharded, *shards = await bus.queue_states((names.results, *names.results_shards))
    return ResultsQueues(unsharded, tuple(shards))


def main() -> None:
    """Console entry point."""
    answer_help(
        "relay-dispatcher",
        "Claims queued jobs under a lease and streams their rows to the rows queue.",
    )
    run_service("dispatcher", build)


if __name__ == "__main__":
    main()
