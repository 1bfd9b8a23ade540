"""Announcing jobs on the bus: a dispatcher wake-up for a job that is ready to run, and
``job.finished`` (confirmed) followed by the outbox flag for a job that ended.

Every service that queues a job (ingest-api, the scheduler) wakes a dispatcher with
:func:`wake_dispatcher`. Every service that ends a job (aggregator: completed;
dispatcher: failed; ingest-api: canceled) announces it with :func:`announce_finished`.
If the process dies between its two steps the flag stays unset and the aggregator's
outbox scan announces the job again; the notifier's delivery claim keeps the webhook
single.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import EVENT_FINISHED, broker_priority
from relay_batches.messages import DispatchWakeup, JobEvent

PublishEvent = Callable[[str, bytes], Awaitable[None]]
MarkPublished = Callable[[list[str]], Awaitable[None]]


async def announce_finished(
    publish: PublishEvent, mark_published: MarkPublished, events: Sequence[JobEvent]
) -> None:
    """Publish ``job.finished`` for each event, then record that they went out."""
    if not events:
        return
    await asyncio.gather(*(publish(EVENT_FINISHED, event.encode()) for event in events))
    await mark_published([event.batch_id for event in events])


async def wake_dispatcher(
    bus: Bus, job_id: str, priority: int, *, trace: str | None = None
) -> None:
    """Tell a dispatcher that job ``job_id`` is queued, at the job's broker priority (with
    the job's trace context, if it is traced)."""
    await bus.publish(
        bus.names.dispatch,
        DispatchWakeup(job_id, priority).encode(),
        kind="dispatch",
        priority=broker_priority(priority),
        trace=trace,
    )
