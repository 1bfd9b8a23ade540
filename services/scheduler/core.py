"""Spawning cron runs: which tick is due, when the next one falls, one pass of the
scheduler; and the reaper, which ends jobs past their completion window (:class:`Reaper`).

Time is always a parameter (``now``): each pass reads the database's clock (one query),
never the replica's own, so a replica whose clock is off neither runs a template early
nor sleeps as if it were late; tests pass a simulated one to :meth:`Scheduler.tick`.
A template late by several ticks (the scheduler was down) gets one run, for the latest
tick that has passed, and its ``next_run_at`` jumps past ``now``: a backlog never turns
into a burst.

No aio-pika or asyncpg here: the stores and the publishers are passed in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from relay_batches.announce import MarkPublished, PublishEvent, announce_finished
from relay_batches.bus.topology import EVENT_CANCELED
from relay_batches.cron import latest_tick, next_tick
from relay_batches.ledger.expiry import ExpiredJob
from relay_batches.ledger.schedule import DueTemplate, Plan, PlannedTick, SpawnedRun
from relay_batches.messages import JobEvent
from relay_batches.metrics import JOB_TRANSITIONS
from relay_batches.model import JobStatus, iso

log = logging.getLogger("relay.scheduler")

SPAWN_PAGE = 100
EXPIRY_PAGE = 500
MIN_SLEEP_S = 0.1
CLOCK_SKEW_WARN_S = 5.0

WakeDispatcher = Callable[[SpawnedRun], Awaitable[None]]
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The replica's wall clock, in UTC (only compared with the database's, to warn)."""
    return datetime.now(UTC)


def sleep_seconds(wake_at: datetime | None, now: datetime, cap: float) -> float:
    """How long to sleep before the next pass: until ``wake_at``, at most ``cap``."""
    if wake_at is None:
        return cap
    return max(0.0, min(cap, (wake_at - now).total_seconds()))


class Store(Protocol):
    """What the scheduler needs of the ledger."""

    async def spawn_due(
        self, now: datetime, limit: int, plan: Plan
    ) -> tuple[int, list[SpawnedRun]]:
        """Lock due templates, insert their runs, advance them; (locked, inserted)."""

    async def now(self) -> datetime:
        """The database's clock."""

    async def earliest_next_run(self) -> tuple[datetime | None, datetime]:
        """The soonest next_run_at of any scheduled template, and the database's clock."""


def run_name(template_name: str, tick: datetime) -> str:
    """A run's name: its template's name and the tick it runs for."""
    return f"{template_name} @ {iso(tick)}"


def plan_ticks(templates: Sequence[DueTemplate], now: datetime) -> list[PlannedTick]:
    """For each due template: the one tick to run now, and the next tick after ``now``."""
    planned = []
    for template in templates:
        tick = max(latest_tick(template.cron, now), template.next_run_at)
        planned.append(
            PlannedTick(
                template_id=template.id,
                run_name=run_name(template.name, tick),
                tick=tick,
                next_run_at=next_tick(template.cron, now),
            )
        )
    return planned


@dataclass(frozen=True)
class TickResult:
    """What one pass did, when the next template falls due (None: no template), and the
    database's clock when that was read."""

    spawned: list[SpawnedRun]
    wake_at: datetime | None
    checked_at: datetime


class Scheduler:
    """One pass at a time: spawn every due run, wake a dispatcher for each."""

    def __init__(self, store: Store, wake_dispatcher: WakeDispatcher) -> None:
        self._store = store
        self._wake_dispatcher = wake_dispatcher
        self._skewed = False

    async def tick(self, now: datetime) -> TickResult:
        """Spawn the runs due at ``now``; return them and the next time to look."""
        spawned: list[SpawnedRun] = []
        while True:
            locked, runs = await self._store.spawn_due(
                now, SPAWN_PAGE, lambda due: plan_ticks(due, now)
            )
            spawned.extend(runs)
            if locked < SPAWN_PAGE:
                break
        for run in spawned:
            log.info(
                "run_spawned",
                extra={"batch_id": run.id, "template_id": run.template_id, "tick": iso(run.tick)},
            )
            await self._wake(run)
        return TickResult(spawned, *await self._store.earliest_next_run())

    async def spawn_pass(self, clock: Clock, max_sleep_s: float) -> float:
        """One pass at the database's clock; return the seconds to sleep until the next:
        until the earliest next tick by the database's clock, at most ``max_sleep_s``, at
        least :data:`MIN_SLEEP_S` (a template due but locked by another scheduler must not
        make the loop spin). ``clock`` (the replica's) is only compared, to warn."""
        now = await self._store.now()
        self._check_skew(clock() - now)
        result = await self.tick(now)
        return max(MIN_SLEEP_S, sleep_seconds(result.wake_at, result.checked_at, max_sleep_s))

    def _check_skew(self, skew: timedelta) -> None:
        skewed = abs(skew.total_seconds()) > CLOCK_SKEW_WARN_S
        if skewed and not self._skewed:
            log.warning("clock_skew", extra={"skew_s": round(skew.total_seconds(), 1)})
        self._skewed = skewed

    async def _wake(self, run: SpawnedRun) -> None:
        try:
            await self._wake_dispatcher(run)
        except Exception as exc:
            # The run is committed; the dispatcher's reconcile scan will find it.
            log.warning("wakeup_failed", extra={"batch_id": run.id, "error": repr(exc)})


class ExpiryLedger(Protocol):
    """What the reaper needs of the ledger."""

    async def expire_due(self, limit: int) -> list[ExpiredJob]:
        """Move due queued/running jobs to ``expired``; those jobs (each to one caller)."""


class Reaper:
    """Ends jobs past their completion window, and announces each as a cancel is.

    Every job it expires gets ``job.canceled`` (status ``expired``: row-workers abort
    its calls in flight and drop its queued rows, dispatchers stop releasing them) and
    ``job.finished`` (the notifier's completion webhook), then the outbox flag. A job
    is expired by exactly one reaper (see :class:`~relay_batches.ledger.expiry.ExpiryStore`),
    so it is announced once; if the reaper dies in between, the aggregator's outbox scan
    announces it and outcomes still arriving make the aggregator repeat the cancel.
    """

    def __init__(
        self,
        store: ExpiryLedger,
        publish_event: PublishEvent,
        mark_published: MarkPublished,
        page: int = EXPIRY_PAGE,
    ) -> None:
        self._store = store
        self._publish = publish_event
        self._mark_published = mark_published
        self._page = page

    async def expire_pass(self) -> int:
        """Expire every due job, ``page`` at a time (each page announced before the next
        is taken); return how many this pass expired."""
        expired = 0
        while True:
            jobs = await self._store.expire_due(self._page)
            expired += len(jobs)
            await self._announce(jobs)
            if len(jobs) < self._page:
                return expired

    async def _announce(self, jobs: list[ExpiredJob]) -> None:
        if not jobs:
            return
        events = [JobEvent(j.id, JobStatus.EXPIRED, j.total, j.completed, j.failed) for j in jobs]
        for job in jobs:
            JOB_TRANSITIONS.labels(JobStatus.EXPIRED).inc()
            log.info(
                "job_expired",
                extra={"batch_id": job.id, "completed": job.completed, "failed": job.failed},
            )
        await asyncio.gather(*(self._publish(EVENT_CANCELED, e.encode()) for e in events))
        await announce_finished(self._publish, self._mark_published, events)
