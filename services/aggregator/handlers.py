"""Recording a chunk of outcome messages and announcing what changed.

No aio-pika or asyncpg here: the store and the event publisher are passed in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from relay.bus.topology import EVENT_FINISHED, EVENT_PROGRESS
from relay.ledger.outcomes import JobProgress
from relay.messages import JobEvent, MessageError, OutcomeBatch, RowOutcome
from relay.metrics import JOB_TRANSITIONS, ROWS_RECORDED

log = logging.getLogger("relay.aggregator")

PublishEvent = Callable[[str, bytes], Awaitable[None]]


class Store(Protocol):
    """What the aggregator needs of the ledger."""

    async def record(self, outcomes: Sequence[RowOutcome]) -> list[JobProgress]:
        """Insert outcomes idempotently; return the touched jobs' counters."""

    async def snapshot(self, batch_ids: list[str]) -> list[JobProgress]:
        """Current counters of these jobs."""

    async def unannounced_terminal(self, older_than_s: float, limit: int = 100) -> list[str]:
        """Terminal jobs whose finished event is not yet out."""

    async def mark_finished_published(self, batch_ids: list[str]) -> None:
        """Record that finished went out."""


def decode_bodies(bodies: Sequence[bytes]) -> tuple[list[RowOutcome], list[int]]:
    """All outcomes of the decodable bodies, and the positions of the undecodable ones."""
    outcomes: list[RowOutcome] = []
    bad: list[int] = []
    for position, body in enumerate(bodies):
        try:
            outcomes.extend(OutcomeBatch.decode(body).outcomes)
        except MessageError as exc:
            log.error("results_rejected", extra={"error": str(exc)})
            bad.append(position)
    return outcomes, bad


class Aggregator:
    """Records outcomes, then publishes ``job.progress`` and, once, ``job.finished``."""

    def __init__(self, store: Store, publish_event: PublishEvent) -> None:
        self._store = store
        self._publish = publish_event

    async def record(self, outcomes: Sequence[RowOutcome]) -> list[JobProgress]:
        """Record one chunk and announce its effect; return the jobs' new counters."""
        progress = await self._store.record(outcomes)
        for job in progress:
            ROWS_RECORDED.labels("content").inc(job.new_completed)
            ROWS_RECORDED.labels("error").inc(job.new_failed)
        await self._announce(progress)
        return progress

    async def announce_unannounced(self, older_than_s: float) -> int:
        """Publish ``job.finished`` for terminal jobs nobody announced (crash, cancel)."""
        ids = await self._store.unannounced_terminal(older_than_s)
        if not ids:
            return 0
        jobs = await self._store.snapshot(ids)
        await self._announce_finished(jobs)
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
        if not jobs:
            return
        await asyncio.gather(*(self._publish(EVENT_FINISHED, _event(j).encode()) for j in jobs))
        await self._store.mark_finished_published([job.id for job in jobs])


def _event(job: JobProgress) -> JobEvent:
    return JobEvent(job.id, job.status, job.total, job.completed, job.failed)
