"""Announcing terminal jobs: publish ``job.finished`` (confirmed), then set the outbox flag.

Every service that ends a job (aggregator: completed; dispatcher: failed; ingest-api:
canceled) announces it this way. If the process dies between the two steps the flag
stays unset and the aggregator's outbox scan announces the job again; the notifier's
delivery claim keeps the webhook single.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from relay_batches.bus.topology import EVENT_FINISHED
from relay_batches.messages import JobEvent

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
