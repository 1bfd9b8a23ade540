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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import EVENT_FINISHED, broker_priority
from relay_batches.messages import DispatchWakeup, JobEvent

MarkPublished = Callable[[list[str]], Awaitable[None]]


class PublishEvent(Protocol):
    """Publish a job event (confirmed); ``trace``: the W3C context of the traced job it
    is about, passed only when there is one (see :func:`publish_about`)."""

    def __call__(
        self, routing_key: str, body: bytes, *, trace: str | None = None
    ) -> Awaitable[None]:
        """Publish ``body`` with ``routing_key``."""
        ...


async def publish_about(
    publish: PublishEvent, routing_key: str, body: bytes, trace: str | None
) -> None:
    """Publish an event about one job, carrying its trace context if it has one."""
    if trace is None:
        await publish(routing_key, body)
    else:
        await publish(routing_key, body, trace=trace)


async def announce_finished(
    publish: PublishEvent,
    mark_published: MarkPublished,
    events: Sequence[JobEvent],
    traces: Mapping[str, str] | None = None,
) -> None:
    """Publish ``job.finished`` for each event (with its job's trace context of
    ``traces``, by job id, if any), then record that they went out."""
    if not events:
        return
    known = traces or {}
    await asyncio.gather(
        *(
            publish_about(publish, EVENT_FINISHED, event.encode(), known.get(event.batch_id))
            for event in events
        )
    )
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
