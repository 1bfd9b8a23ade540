"""The row-worker: ``rows`` tasks, each acked once every row's outcome is confirmed on
its job's results shard (a redelivered or re-sent one first loses its rows that have an
outcome, and one whose channel closed starts no more rows: :mod:`.paid_once`);
``job.canceled`` events (a cancel, or an expiry: status ``expired``) abort that job's
calls in flight and drop its rows still to come; ``job.paused`` and
``job.budget_stopped`` set its rows not started aside (see :mod:`.controls`);
``job.overtaking`` hands back the rows not started of held slices below a job's boosted
rows (see :mod:`.start_gate`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from relay_batches.bus.topology import (
    EVENT_BUDGET_STOPPED,
    EVENT_CANCELED,
    EVENT_HOLDING,
    EVENT_OVERTAKING,
    EVENT_PAUSED,
    MAX_PRIORITY,
    rows_prefetch,
)
from relay_batches.kit.base import BusService, ServiceBus
from relay_batches.kit.consumer import ConsumeDeliveries, Subscribe
from relay_batches.kit.periodic import Periodic, every
from relay_batches.messages import JobEvent, SliceMessage
from relay_batches.ratelimit.keeper import Keeper
from relay_batches.ratelimit.parts import RateLimitParts, rate_limit_parts
from relay_batches.services.row_worker.core import RowRunner
from relay_batches.services.row_worker.holdings import Holdings
from relay_batches.services.row_worker.outcomes import OutcomePublisher
from relay_batches.services.row_worker.paid_once import AnsweredRows, PaidOnce


def hand_over_priority(level: int) -> int:
    """The broker level a stopping worker hands rows over at: one above their slice's,
    so they go ahead of slices sent after them, as a requeued message goes back near the
    head of its queue (the dispatcher's stall recovery takes rows nobody holds, once a
    later slice of theirs is delivered, for lost). The body keeps the slice's level."""
    return min(MAX_PRIORITY, level + 1)


def outcome_batch_rows(flush_rows: int, concurrency: int, slice_rows: int) -> int:
    """Outcomes one results message waits for at most: ``flush_rows``, but never more
    than the rows the worker holds beyond its slots (its prefetch of slices less its
    concurrency). A slice is acked only once its outcomes are confirmed, so a message
    that waited for more would wait out its whole linger with every slot idle: no new
    slice comes until one is acked."""
    held = rows_prefetch(concurrency, slice_rows) * slice_rows
    return max(1, min(flush_rows, held - concurrency))


def row_worker_service(
    bus: ServiceBus,
    runner: RowRunner,
    outcomes: OutcomePublisher,
    *,
    prefetch: int,
    grace_s: float,
    heartbeat: Periodic | None = None,
    keeper: Keeper | None = None,
    ratelimit: RateLimitParts | None = None,
    paid_once: PaidOnce | None = None,
) -> BusService:
    """The row-worker's declaration (its readiness needs no ledger: it reads one only
    for a redelivered or re-sent slice, through ``paid_once``, which by default checks
    only what this worker answered); ``heartbeat`` reports the rows it holds (see
    :mod:`.holdings`); ``ratelimit`` the shared rate limits' election, ticks and
    throttled events (:func:`rate_limit_parts`; none without a limited deployment),
    whose ``keeper`` goes on issuing through the drain and resigns in the close (after
    it)."""
    parts = ratelimit or rate_limit_parts(None, None)

    def stopping() -> None:
        runner.stop_starting()

    async def close() -> None:
        # Resign first: a flush of outcomes that is slow (a stuck publish runs to its
        # timeout) must not keep every other worker from leading meanwhile.
        if keeper is not None:
            await keeper.close()
        await outcomes.drain()

    async def on_canceled(event: JobEvent) -> None:
        runner.cancel_job(event.batch_id)

    async def on_paused(event: JobEvent) -> None:
        if runner.controls is not None:
            runner.controls.pause(event.batch_id, event.pauses)

    async def on_overtaking(event: JobEvent) -> None:
        runner.overtaken_below(event.level)

    async def on_budget_stopped(event: JobEvent) -> None:
        if runner.controls is not None:
            runner.controls.budget_stop(event.batch_id)

    canceled = Subscribe(
        {
            EVENT_CANCELED: on_canceled,
            EVENT_PAUSED: on_paused,
            EVENT_BUDGET_STOPPED: on_budget_stopped,
            EVENT_OVERTAKING: on_overtaking,
        },
        JobEvent.decode,
    )
    handler = paid_once or PaidOnce(runner.handle_slice, AnsweredRows())
    rows = ConsumeDeliveries(
        bus.names.rows, "rows", SliceMessage.decode, handler.handle, prefetch, retry_pause_s=0
    )
    return BusService(
        bus,
        [canceled, *parts.intakes, rows],
        periodic=[*([] if heartbeat is None else [heartbeat]), *parts.periodic],
        grace_s=grace_s,
        stopping=stopping,
        close=close,
    )


def holding_heartbeat(
    holdings: Holdings, publish_event: Callable[[str, bytes], Awaitable[None]], every_s: float
) -> Periodic:
    """The periodic ``worker.holding`` report of what ``holdings`` holds."""

    async def report() -> None:
        await publish_event(EVENT_HOLDING, holdings.report().encode())

    return every("heartbeat", every_s, report)
