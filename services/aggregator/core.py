"""Recording a chunk of outcome messages and announcing what changed; the periodic
outbox pass (unannounced ends, then the budget settle).

No aio-pika or asyncpg here: the store and the event publisher are passed in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from relay_batches.announce import PublishEvent, announce_finished, publish_about
from relay_batches.bus.topology import (
    EVENT_BUDGET_STOPPED,
    EVENT_CANCELED,
    EVENT_PAUSED,
    progress_key,
)
from relay_batches.errors import PermanentError, UnstorableError
from relay_batches.ledger.outcomes import JobProgress
from relay_batches.messages import JobEvent, OutcomesMessage, RowOutcome
from relay_batches.metrics import (
    AGGREGATOR_TRANSACTION_ROWS,
    AGGREGATOR_TRANSACTION_SECONDS,
    JOB_TIME_TO_FINISH,
    JOB_TRANSITIONS,
    ROWS_RECORDED,
)
from relay_batches.model import JobStatus
from relay_batches.services.aggregator.traced import record_spans

log = logging.getLogger("relay.aggregator")

CANCEL_REPEAT_S = 5.0
CANCEL_MEMORY = 10_000
SETTLE_PASS_S = 1.0  # budget settle steps run for at most this long per outbox pass


class Store(Protocol):
    """What the aggregator needs of the ledger."""

    async def record(self, outcomes: Sequence[RowOutcome]) -> list[JobProgress]:
        """Insert outcomes idempotently; return the touched jobs' counters."""

    async def snapshot(self, batch_ids: list[str]) -> list[JobProgress]:
        """Current counters of these jobs."""

    async def canceled_among(self, batch_ids: list[str]) -> list[tuple[str, JobStatus]]:
        """Which of these jobs are canceled or expired, with that status."""

    async def unannounced_terminal(self, older_than_s: float, limit: int = 100) -> list[str]:
        """Terminal jobs whose finished event is not yet out."""

    async def mark_finished_published(self, batch_ids: list[str]) -> None:
        """Record that finished went out."""

    async def settle_budget_stops(self) -> list[JobProgress]:
        """One budget settle step: withhold never-released rows of one stopped job."""

    async def record_returned(self, returned: Sequence[tuple[str, int, int]]) -> int:
        """Record rows handed back unstarted (a pause) for their job's next release."""


class Aggregator:
    """Records outcomes, then publishes ``job.progress.<owner>`` to the dispatcher whose
    lease the job was under (nothing for a job without one: no dispatcher releases its
    rows) and, once, ``job.finished``.

    Outcomes that still arrive for a canceled (or expired) job mean some row-worker
    missed the cancel (it started later, or was reconnecting): the cancel is broadcast
    again with the job's status, at most once per :data:`CANCEL_REPEAT_S` per job, so
    such workers drop the rest.
    """

    def __init__(
        self, store: Store, publish_event: PublishEvent, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._store = store
        self._publish = publish_event
        self._clock = clock
        self._cancel_sent = Repeats()
        self._stop_sent = Repeats()
        self._pause_sent = Repeats()

    async def record(self, outcomes: Sequence[RowOutcome]) -> list[JobProgress]:
        """Record one chunk and announce its effect; return the jobs' new counters."""
        started, started_ns = time.perf_counter(), time.time_ns()
        progress = await self._store.record(outcomes)
        _observe_transaction(outcomes, time.perf_counter() - started)
        traces = record_spans(progress, started_ns, time.time_ns())
        for job in progress:
            ROWS_RECORDED.labels("content").inc(job.new_completed)
            ROWS_RECORDED.labels("error").inc(job.new_failed)
        await self._announce(progress, mean_latencies(outcomes), traces)
        recorded = {job.id for job in progress}
        unrecorded = sorted({o.batch_id for o in outcomes} - recorded)
        if unrecorded:
            await self._repeat_cancels(unrecorded)
        return progress

    async def record_messages(self, messages: Sequence[OutcomesMessage]) -> list[JobProgress]:
        """Record every outcome of a chunk of messages. If the ledger refuses some of the
        chunk's data, the rest is recorded all the same (set-based when the refused
        outcomes are known, else outcome by outcome), so one unstorable reply cannot hold
        back (or requeue) the rest forever; then :class:`UnstorableError` names the
        messages holding outcomes that can never be stored (for a dead-letter queue)."""
        returned = [row for message in messages for row in message.returned]
        if returned:
            log.info("rows_returned", extra={"rows": await self._store.record_returned(returned)})
        outcomes = [outcome for message in messages for outcome in message.outcomes]
        try:
            return await self.record(outcomes)
        except PermanentError as exc:
            log.error("chunk_refused", extra={"outcomes": len(outcomes), "error": str(exc)})
            refused = await self._record_all_but(outcomes, exc)
        if not refused:
            return []
        owners = [m for m, message in enumerate(messages) for _ in message.outcomes]
        raise UnstorableError(
            {owners[position] for position in refused},
            f"{len(refused)} outcome(s) can never be stored: {', '.join(sorted(refused.values()))}",
        )

    async def _record_all_but(
        self, outcomes: Sequence[RowOutcome], exc: PermanentError
    ) -> dict[int, str]:
        """Record what ``exc`` did not refuse; return the refused positions with why."""
        if not isinstance(exc, UnstorableError):
            return await self.record_each(outcomes)
        refused = {position: exc.reason for position in exc.positions}
        rest = [(p, o) for p, o in enumerate(outcomes) if p not in refused]
        try:
            await self.record([o for _, o in rest])
            return refused
        except PermanentError:
            again = await self.record_each([o for _, o in rest])
        return refused | {rest[p][0]: reason for p, reason in again.items()}

    async def record_each(self, outcomes: Sequence[RowOutcome]) -> dict[int, str]:
        """Record outcomes one at a time after a chunk was refused as a whole; an outcome
        the ledger still refuses becomes that row's ``internal_error``. Returns the
        positions of the outcomes that cannot be stored even so, with why."""
        refused: dict[int, str] = {}
        for position, outcome in enumerate(outcomes):
            reason = await self._record_one(outcome)
            if reason is not None:
                refused[position] = reason
        return refused

    async def _record_one(self, outcome: RowOutcome) -> str | None:
        """Record one outcome, or its ``internal_error`` replacement; None, or why not."""
        where = {"batch_id": outcome.batch_id, "row": outcome.row_index}
        try:
            await self.record([outcome])
            return None
        except UnstorableError as exc:
            log.error("outcome_unstorable", extra={**where, "error": exc.reason})
            return exc.reason
        except PermanentError as exc:
            log.error("outcome_unstorable", extra={**where, "error": str(exc)})
        try:
            await self.record([unstorable(outcome)])
            return None
        except PermanentError as exc:
            log.error("outcome_unstorable", extra={**where, "error": str(exc)})
            return str(exc)

    async def _repeat_cancels(self, batch_ids: list[str]) -> None:
        now = self._clock()
        due = self._cancel_sent.due(batch_ids, now)
        if not due:
            return
        for batch_id, status in await self._store.canceled_among(due):
            self._cancel_sent.mark(batch_id, now)
            event = JobEvent(batch_id, status, 0, 0, 0)
            await self._publish(EVENT_CANCELED, event.encode())
            log.info("cancel_repeated", extra={"batch_id": batch_id})

    async def _repeat_pauses(self, progress: list[JobProgress]) -> None:
        """``job.paused`` again, at most once per :data:`CANCEL_REPEAT_S` per job, for
        paused jobs whose outcomes keep coming: a row-worker that missed the pause (it
        started later, was reconnecting, or the API could not publish it) hands back the
        rows it has not started then."""
        now = self._clock()
        paused = {j.id: j for j in progress if j.status == JobStatus.PAUSED}
        for batch_id in self._pause_sent.due(sorted(paused), now):
            self._pause_sent.mark(batch_id, now)
            await self._publish(EVENT_PAUSED, _event(paused[batch_id]).encode())
            log.info("pause_repeated", extra={"batch_id": batch_id})

    async def _announce_budget_stops(self, progress: list[JobProgress]) -> None:
        """``job.budget_stopped`` for the jobs whose budget stopped them, when it is
        reached and again at most once per :data:`CANCEL_REPEAT_S` while their outcomes
        keep coming (a row-worker that missed it, started later or was reconnecting,
        withholds the rest then)."""
        now = self._clock()
        stopped = {j.id: j for j in progress if j.budget_stopped and not j.terminal}
        due = self._stop_sent.due(sorted(stopped), now)
        for batch_id in due:
            self._stop_sent.mark(batch_id, now)
        await asyncio.gather(
            *(self._publish(EVENT_BUDGET_STOPPED, _event(stopped[b]).encode()) for b in due)
        )

    async def outbox_pass(self, older_than_s: float) -> None:
        """The periodic pass: announce the ends nobody announced, then settle budget stops
        (a settle that fails never holds the announcements back)."""
        await self.announce_unannounced(older_than_s)
        await self.settle_budget_stops()

    async def settle_budget_stops(self, max_s: float = SETTLE_PASS_S) -> int:
        """Give the rows that jobs stopped by their budget never released their
        ``budget_exceeded`` outcome, one bounded step (one short transaction) at a time,
        for at most ``max_s``; each step's counters are announced as a chunk's are
        (``job.progress.<owner>``, and ``job.finished`` for a job it ended). Returns the rows
        withheld; what is left waits for the next pass."""
        started, withheld = self._clock(), 0
        while True:
            progress = await self._store.settle_budget_stops()
            if not progress:
                break
            for job in progress:
                ROWS_RECORDED.labels("error").inc(job.new_failed)
                withheld += job.new_failed
            await self._announce(progress)
            if self._clock() - started >= max_s:
                break
        if withheld:
            log.info("budget_settled", extra={"rows": withheld})
        return withheld

    async def announce_unannounced(self, older_than_s: float) -> int:
        """Publish ``job.finished`` for terminal jobs nobody announced (crash, cancel)."""
        ids = await self._store.unannounced_terminal(older_than_s)
        if not ids:
            return 0
        jobs = await self._store.snapshot(ids)
        await self._announce_finished(jobs)
        log.info("outbox_announced", extra={"jobs": len(jobs)})
        return len(jobs)

    async def _announce(
        self,
        progress: list[JobProgress],
        latencies: Mapping[str, float] | None = None,
        traces: Mapping[str, str] | None = None,
    ) -> None:
        """Publish the jobs' progress (and each finished job's end); ``traces``: the
        context each traced job's events carry (its ``record`` span's), by job id."""
        paces, known = latencies or {}, traces or {}
        await asyncio.gather(
            *(
                publish_about(
                    self._publish,
                    progress_key(j.owner),
                    _event(j, paces.get(j.id, 0.0)).encode(),
                    known.get(j.id),
                )
                for j in progress
                if j.owner
            ),
            # Row-workers withhold the rows they hold and have not started of these.
            self._announce_budget_stops(progress),
            self._repeat_pauses(progress),
        )
        finished = [job for job in progress if job.terminal]
        for job in finished:
            JOB_TRANSITIONS.labels(job.status).inc()
            JOB_TIME_TO_FINISH.labels(job.status).observe(job.age_s)
            log.info(
                "job_finished",
                extra={
                    "batch_id": job.id,
                    "status": job.status,
                    "total": job.total,
                    "completed": job.completed,
                    "failed": job.failed,
                    "seconds": round(job.age_s, 3),
                },
            )
        await self._announce_finished(finished, known)

    async def _announce_finished(
        self, jobs: list[JobProgress], traces: Mapping[str, str] | None = None
    ) -> None:
        await announce_finished(
            self._publish, self._store.mark_finished_published, [_event(j) for j in jobs], traces
        )


class Repeats:
    """When an event was last sent for each job (the latest :data:`CANCEL_MEMORY` jobs),
    so it is repeated at most once per :data:`CANCEL_REPEAT_S`."""

    def __init__(self) -> None:
        self._sent: OrderedDict[str, float] = OrderedDict()

    def due(self, batch_ids: Sequence[str], now: float) -> list[str]:
        """The jobs of ``batch_ids`` whose event may go out at ``now``."""
        return [
            b for b in batch_ids if now - self._sent.get(b, -CANCEL_REPEAT_S) >= CANCEL_REPEAT_S
        ]

    def mark(self, batch_id: str, now: float) -> None:
        """The event of ``batch_id`` went out at ``now``."""
        self._sent[batch_id] = now
        self._sent.move_to_end(batch_id)
        while len(self._sent) > CANCEL_MEMORY:
            self._sent.popitem(last=False)


def _observe_transaction(outcomes: Sequence[RowOutcome], elapsed_s: float) -> None:
    """Count one recording transaction (rows, time) and log it at debug level."""
    AGGREGATOR_TRANSACTION_ROWS.observe(len(outcomes))
    AGGREGATOR_TRANSACTION_SECONDS.observe(elapsed_s)
    if log.isEnabledFor(logging.DEBUG):
        log.debug(
            "outcomes_recorded",
            extra={
                "rows": len(outcomes),
                "jobs": sorted({o.batch_id for o in outcomes}),
                "elapsed_ms": round(elapsed_s * 1000, 2),
            },
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


def _event(job: JobProgress, latency_ms: float = 0.0) -> JobEvent:
    return JobEvent(
        job.id, job.status, job.total, job.completed, job.failed, job.pauses, latency_ms
    )


def mean_latencies(outcomes: Sequence[RowOutcome]) -> dict[str, float]:
    """Per job, the mean upstream time (ms) of ``outcomes`` that measured one: what the
    progress event tells the dispatcher pacing the job's releases."""
    sums: dict[str, tuple[float, int]] = {}
    for outcome in outcomes:
        if outcome.latency_ms is not None:
            total, count = sums.get(outcome.batch_id, (0.0, 0))
            sums[outcome.batch_id] = (total + outcome.latency_ms, count + 1)
    return {batch_id: total / count for batch_id, (total, count) in sums.items()}
