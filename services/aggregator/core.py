"""Recording a chunk of outcome messages and announcing what changed.

No aio-pika or asyncpg here: the store and the event publisher are passed in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Protocol

from relay_batches.announce import announce_finished
from relay_batches.bus.topology import EVENT_CANCELED, EVENT_PROGRESS
from relay_batches.errors import PermanentError
from relay_batches.ledger.outcomes import JobProgress
from relay_batches.messages import JobEvent, OutcomesMessage, RowOutcome
from relay_batches.metrics import JOB_TRANSITIONS, ROWS_RECORDED
from relay_batches.model import JobStatus

log = logging.getLogger("relay.aggregator")

PublishEvent = Callable[[str, bytes], Awaitable[None]]
CANCEL_REPEAT_S = 5.0
CANCEL_MEMORY = 10_000


class Store(Protocol):
    """What the aggregator needs of the ledger."""

    async def record(self, outcomes: Sequence[RowOutcome]) -> list[JobProgress]:
        """Insert outcomes idempotently; return the touched jobs' counters."""

    async def snapshot(self, batch_ids: list[str]) -> list[JobProgress]:
        """Current counters of these jobs."""

    async def canceled_among(self, batch_ids: list[str]) -> list[str]:
        """Which of these jobs are canceled."""

    async def unannounced_terminal(self, older_than_s: float, limit: int = 100) -> list[str]:
        """Terminal jobs whose finished event is not yet out."""

    async def mark_finished_published(self, batch_ids: list[str]) -> None:
        """Record that finished went out."""


class Aggregator:
    """Records outcomes, then publishes ``job.progress`` and, once, ``job.finished``.

    Outcomes that still arrive for a canceled job mean some row-worker missed the
    cancel (it started later, or was reconnecting): the cancel is broadcast again, at
    most once per :data:`CANCEL_REPEAT_S` per job, so such workers drop the rest.
    """

    def __init__(
        self, store: Store, publish_event: PublishEvent, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._publish = publish_event
        self._clock = clock
        self._cancel_sent: OrderedDict[str, float] = OrderedDict()

    async def record(self, outcomes: Sequence[RowOutcome]) -> list[JobProgress]:
        """Record one chunk and announce its effect; return the jobs' new counters."""
        progress = await self._store.record(outcomes)
        for job in progress:
            ROWS_RECORDED.labels("content").inc(job.new_completed)
            ROWS_RECORDED.labels("error").inc(job.new_failed)
        await self._announce(progress)
        recorded = {job.id for job in progress}
        unrecorded = sorted({o.batch_id for o in outcomes} - recorded)
        if unrecorded:
            await self._repeat_cancels(unrecorded)
        return progress

    async def record_messages(self, messages: Sequence[OutcomesMessage]) -> list[JobProgress]:
        """Record every outcome of a chunk of messages; if the ledger refuses the chunk's
        data, record it outcome by outcome so one unstorable reply cannot hold back (or
        requeue) the rest forever."""
        outcomes = [outcome for message in messages for outcome in message.outcomes]
        try:
            return await self.record(outcomes)
        except PermanentError as exc:
            log.error("chunk_refused", extra={"outcomes": len(outcomes), "error": str(exc)})
            await self.record_each(outcomes)
            return []

    async def record_each(self, outcomes: Sequence[RowOutcome]) -> int:
        """Record outcomes one at a time after a chunk was refused as a whole; an outcome
        the ledger still refuses becomes that row's ``internal_error``. Returns how many
        were replaced that way."""
        replaced = 0
        for outcome in outcomes:
            try:
                await self.record([outcome])
            except PermanentError as exc:
                log.error(
                    "outcome_unstorable",
                    extra={
                        "batch_id": outcome.batch_id,
                        "row": outcome.row_index,
                        "error": str(exc),
                    },
                )
                await self.record([unstorable(outcome)])
                replaced += 1
        return replaced

    async def _repeat_cancels(self, batch_ids: list[str]) -> None:
        now = self._clock()
        due = [
            b
            for b in batch_ids
            if now - self._cancel_sent.get(b, -CANCEL_REPEAT_S) >= CANCEL_REPEAT_S
        ]
        if not due:
            return
        for batch_id in await self._store.canceled_among(due):
            self._cancel_sent[batch_id] = now
            self._cancel_sent.move_to_end(batch_id)
            event = JobEvent(batch_id, JobStatus.CANCELED, 0, 0, 0)
            await self._publish(EVENT_CANCELED, event.encode())
            log.info("cancel_repeated", extra={"batch_id": batch_id})
        while len(self._cancel_sent) > CANCEL_MEMORY:
            self._cancel_sent.popitem(last=False)

    async def announce_unannounced(self, older_than_s: float) -> int:
        """Publish ``job.finished`` for terminal jobs nobody announced (crash, cancel)."""
        ids = await self._store.unannounced_terminal(older_than_s)
        if not ids:
            return 0
        jobs = await self._store.snapshot(ids)
        await self._announce_finished(jobs)
        log.info("outbox_announced", extra={"jobs": len(jobs)})
        return len(jobs)

    async def _announce(self, progress: list[JobProgress]) -> None:
        await asyncio.gather(*(self._publish(EVENT_PROGRESS, _event(j).encode()) for j in progress))
        finished = [job for job in progress if job.terminal]
        for job in finished:
            JOB_TRANSITIONS.labels(job.status).inc()
            log.info(
                "job_finished",
                extra={"batch_id": job.id, "status": job.status, "total": job.total},
            )
        await self._announce_finished(finished)

    async def _announce_finished(self, jobs: list[JobProgress]) -> None:
        await announce_finished(
            self._publish, self._store.mark_finished_published, [_event(j) for j in jobs]
        )


def unstorable(outcome: RowOutcome) -> RowOutcome:
    """The error outcome that replaces one the ledger refuses to store."""
    return replace(
        outcome,
        content=None,
        error="internal_error: the upstream reply could not be stored",
        dead_letter=False,
        prompt_tokens=0,
        completion_tokens=0,
    )


def _event(job: JobProgress) -> JobEvent:
    return JobEvent(job.id, job.status, job.total, job.completed, job.failed)
