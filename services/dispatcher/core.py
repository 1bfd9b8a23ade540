"""Releasing rows: claim jobs, keep a bounded window of each job's rows in the broker.

For every job it owns, the dispatcher keeps ``dispatched_upto - done <= window`` and the
message text of its rows in flight within ``window_bytes`` (one row larger than that goes
out alone, when nothing else of the job is in flight): it publishes task slices of
consecutive rows (confirmed) and then records the new ``dispatched_upto`` in the ledger,
so a restart resumes where it left off (at worst re-publishing a slice, which the
aggregator's idempotent insert absorbs).

No aio-pika or asyncpg here: the store and the publishers are passed in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from relay_batches.ledger.dispatch import ByteWindow, RunningJob, StalledJob
from relay_batches.messages import JobEvent, SliceMessage, SliceRow
from relay_batches.metrics import JOB_TRANSITIONS
from relay_batches.model import TERMINAL, JobStatus

log = logging.getLogger("relay.dispatcher")

PublishSlice = Callable[[SliceMessage, int], Awaitable[None]]
AnnounceFailed = Callable[[JobEvent], Awaitable[None]]
FETCH_SLICES = 16
MAX_SLICE_BYTES = 4 * 1024 * 1024
TOP_UP_FRACTION = 4


def slice_rows(
    rows: list[tuple[int, str]], max_rows: int, max_bytes: int
) -> list[list[tuple[int, str]]]:
    """Consecutive rows cut into task slices of at most ``max_rows`` rows and (unless a
    single row is larger) ``max_bytes`` of messages, so no broker message grows huge."""
    slices: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    size = 0
    for row in rows:
        length = len(row[1])
        if current and (len(current) >= max_rows or size + length > max_bytes):
            slices.append(current)
            current, size = [], 0
        current.append(row)
        size += length
    if current:
        slices.append(current)
    return slices


def byte_window_end(
    in_flight: int, next_rows: Sequence[tuple[int, int]], start: int, end: int, budget: int
) -> int:
    """Where a release of rows ``start..end`` stops so that a job's message text in the
    broker stays within ``budget`` bytes, given ``in_flight`` bytes already out and the
    ``(row_index, size)`` of the rows that would go. ``start`` means the window is full:
    nothing goes while less than a quarter of it is free (few, fuller releases rather
    than one per outcome). With nothing in flight the first row goes even if larger."""
    if in_flight > 0 and budget - in_flight < budget // TOP_UP_FRACTION:
        return start
    total = in_flight
    for index, size in next_rows:
        if total > 0 and total + size > budget:
            return index
        total += size
    return end


class Store(Protocol):
    """What the dispatcher needs of the ledger."""

    async def claim_queued(self, owner: str, limit: int, lease_s: float) -> list[RunningJob]:
        """Claim queued jobs."""

    async def claim_expired(self, owner: str, limit: int, lease_s: float) -> list[RunningJob]:
        """Claim running jobs whose lease expired."""

    async def renew(self, owner: str, job_ids: list[str], lease_s: float) -> list[RunningJob]:
        """Renew leases; return the jobs still ours."""

    async def release(self, owner: str, job_ids: list[str]) -> None:
        """Let go of leases."""

    async def fetch_rows(
        self, job_id: str, rows_batch_id: str, start: int, end: int
    ) -> list[tuple[int, str]]:
        """Read input rows that have no outcome yet."""

    async def claim_stalled(
        self, owner: str, job_ids: list[str], stall_s: float
    ) -> list[StalledJob]:
        """Our jobs without progress for ``stall_s`` (their stall clock restarts)."""

    async def byte_window(
        self, job_id: str, rows_batch_id: str, settled_below: int, upto: int, end: int
    ) -> ByteWindow:
        """Bytes of messages in flight and the sizes of the next rows."""

    async def advance(self, owner: str, job_id: str, upto: int) -> bool:
        """Record dispatched_upto."""

    async def fail(self, job_id: str, error: str) -> bool:
        """Fail a job as a whole."""


@dataclass(frozen=True)
class DispatchConfig:
    """Tuning of one dispatcher."""

    owner: str
    window: int
    slice_rows: int
    max_running_jobs: int
    lease_s: float
    stall_s: float = 120.0
    window_bytes: int = 16 * 1024 * 1024


@dataclass
class OwnedJob:
    """A job this dispatcher releases rows for."""

    job: RunningJob
    dispatched_upto: int
    done: int
    lock: asyncio.Lock
    settled_below: int = 0  # every row below has an outcome (where in-flight bytes start)

    @property
    def exhausted(self) -> bool:
        """Every row has been published."""
        return self.dispatched_upto >= self.job.total


class Dispatcher:
    """Claims jobs and tops up each one's window of rows in the broker."""

    def __init__(
        self,
        store: Store,
        publish_slice: PublishSlice,
        announce_failed: AnnounceFailed,
        model_known: Callable[[str], bool],
        config: DispatchConfig,
        rows_waiting: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self._store = store
        self._publish_slice = publish_slice
        self._announce_failed = announce_failed
        self._model_known = model_known
        self._config = config
        self._rows_waiting = rows_waiting
        self._claiming = asyncio.Lock()
        self._stopped = False
        self.jobs: dict[str, OwnedJob] = {}

    def stop_claiming(self) -> None:
        """From now on claim nothing new (the service is stopping; its leases go back)."""
        self._stopped = True

    async def reconcile(self) -> None:
        """One reconcile pass: claim, renew every lease (topping windows up), recover
        stalled jobs."""
        await self.claim()
        await self.renew()
        await self.recover_stalled()

    async def claim(self) -> int:
        """Claim queued and orphaned jobs up to our limit; start releasing their rows.

        One claim at a time (wake-ups and the reconcile loop race otherwise, and each
        would see the same room), and a job we already own is never adopted twice.
        """
        async with self._claiming:
            return await self._claim()

    async def _claim(self) -> int:
        if self._stopped:
            return 0
        room = self._config.max_running_jobs - len(self.jobs)
        if room <= 0:
            return 0
        cfg = self._config
        claimed = await self._store.claim_expired(cfg.owner, room, cfg.lease_s)
        if len(claimed) < room:
            claimed += await self._store.claim_queued(cfg.owner, room - len(claimed), cfg.lease_s)
        for job in sorted(claimed, key=lambda j: -j.priority):
            if job.id not in self.jobs:
                await self._adopt(job)
        return len(claimed)

    async def _adopt(self, job: RunningJob) -> None:
        if not self._model_known(job.model):
            await self._fail(job, f"model alias {job.model!r} is not in the routes file")
            return
        JOB_TRANSITIONS.labels(JobStatus.RUNNING).inc()
        log.info(
            "job_claimed",
            extra={"batch_id": job.id, "total": job.total, "from_row": job.dispatched_upto},
        )
        owned = OwnedJob(job, job.dispatched_upto, job.done, asyncio.Lock())
        self.jobs[job.id] = owned
        await self.top_up(owned)

    async def _fail(self, job: RunningJob, error: str) -> None:
        if await self._store.fail(job.id, error):
            JOB_TRANSITIONS.labels(JobStatus.FAILED).inc()
            log.warning("job_failed", extra={"batch_id": job.id, "error": error})
            await self._announce_failed(
                JobEvent(job.id, JobStatus.FAILED, job.total, job.completed, job.failed)
            )

    async def on_progress(self, event: JobEvent) -> None:
        """A job's counters moved: forget it if it ended, else top up its window."""
        owned = self.jobs.get(event.batch_id)
        if owned is None:
            return
        if event.status in TERMINAL:
            self.forget(event.batch_id)
            return
        owned.done = max(owned.done, event.completed + event.failed)
        await self.top_up(owned)

    def forget(self, batch_id: str) -> None:
        """Stop releasing rows of ``batch_id`` (ended or canceled)."""
        if self.jobs.pop(batch_id, None) is not None:
            log.info("job_released", extra={"batch_id": batch_id})

    async def renew(self) -> None:
        """Renew our leases, drop jobs no longer ours, refresh counters and top up."""
        if not self.jobs:
            return
        cfg = self._config
        alive = await self._store.renew(cfg.owner, list(self.jobs), cfg.lease_s)
        alive_ids = {job.id for job in alive}
        for batch_id in list(self.jobs):
            if batch_id not in alive_ids:
                self.forget(batch_id)
        for job in alive:
            owned = self.jobs.get(job.id)
            if owned is not None:
                owned.done = max(owned.done, job.done)
                await self.top_up(owned)

    async def recover_stalled(self) -> int:
        """Re-publish the unfinished rows of our jobs that made no progress for a while.

        Rows lost in the broker (a broker replaced without its disk) would otherwise
        keep a job running forever. The job's window is rewound to its first row
        without an outcome and topped up again; rows that have an outcome are skipped,
        and a row still queued somewhere gets a duplicate the aggregator ignores.
        """
        if not self.jobs:
            return 0
        if self._rows_waiting is not None and await self._rows_waiting() > 0:
            # Rows are still queued: jobs without progress are waiting their turn (behind
            # higher priorities or a slow upstream), not lost. Re-publishing would only
            # pile duplicates, each a paid upstream call, on top of them.
            return 0
        cfg = self._config
        stalled = await self._store.claim_stalled(cfg.owner, list(self.jobs), cfg.stall_s)
        for found in stalled:
            owned = self.jobs.get(found.id)
            if owned is None or found.first_unfinished is None:
                continue
            log.warning(
                "job_stalled",
                extra={
                    "batch_id": found.id,
                    "from_row": found.first_unfinished,
                    "dispatched_upto": owned.dispatched_upto,
                    "stall_s": cfg.stall_s,
                },
            )
            async with owned.lock:
                owned.dispatched_upto = min(owned.dispatched_upto, found.first_unfinished)
            await self.top_up(owned)
        return len(stalled)

    async def release_all(self) -> None:
        """Give up every lease (clean shutdown), so another dispatcher takes over at once."""
        if self.jobs:
            await self._store.release(self._config.owner, list(self.jobs))
            self.jobs.clear()

    async def hand_back(self) -> None:
        """:meth:`release_all` at shutdown; if the ledger is away the leases simply expire
        and another dispatcher takes the jobs over then."""
        try:
            await self.release_all()
        except Exception as exc:
            log.warning("release_failed", extra={"error": repr(exc)})

    async def top_up(self, owned: OwnedJob) -> None:
        """Publish slices until the job's window is full or its rows are all out.

        Rows go out in batches of at least a quarter window (or one slice, or the rest of
        the job), so a stream of small progress events costs few ledger reads.
        """
        # A window smaller than one slice would never release anything: use one slice.
        window = max(self._config.window, self._config.slice_rows)
        batch = max(self._config.slice_rows, window // TOP_UP_FRACTION)
        async with owned.lock:
            while not owned.exhausted and owned.job.id in self.jobs:
                room = owned.done + window - owned.dispatched_upto
                if room < min(batch, owned.job.total - owned.dispatched_upto):
                    return
                end = await self._window_end(owned, room)
                if end <= owned.dispatched_upto:
                    return  # the job's byte window is full
                if not await self._release_rows(owned, end):
                    self.forget(owned.job.id)
                    return

    async def _window_end(self, owned: OwnedJob, room: int) -> int:
        """Where the next release stops: ``room`` rows at most (a few whole slices), and
        no further than the job's byte window allows (sizes from the ledger)."""
        job, size = owned.job, self._config.slice_rows
        start = owned.dispatched_upto
        count = min(room, size * FETCH_SLICES)
        if start + count < job.total:
            count -= count % size
        end = min(job.total, start + count)
        window = await self._store.byte_window(
            job.id, job.rows_batch_id, owned.settled_below, start, end
        )
        owned.settled_below = start if window.first_unfinished is None else window.first_unfinished
        budget = self._config.window_bytes
        return byte_window_end(window.in_flight, window.next_rows, start, end, budget)

    async def _release_rows(self, owned: OwnedJob, end: int) -> bool:
        """Publish rows from ``dispatched_upto`` to ``end`` (a few slices); False if the
        job is no longer ours."""
        job, size = owned.job, self._config.slice_rows
        start = owned.dispatched_upto
        rows = await self._store.fetch_rows(job.id, job.rows_batch_id, start, end)
        slices = slice_rows(rows, size, MAX_SLICE_BYTES)
        await asyncio.gather(
            *(
                self._publish_slice(
                    SliceMessage(
                        job.id, job.model, tuple(SliceRow(i, m) for i, m in part), job.params
                    ),
                    job.priority,
                )
                for part in slices
            )
        )
        owned.dispatched_upto = end
        return await self._store.advance(self._config.owner, job.id, end)
