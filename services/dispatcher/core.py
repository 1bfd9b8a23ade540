"""Releasing rows: claim jobs, keep a bounded window of each job's rows in the broker.

For every job it owns, the dispatcher keeps ``dispatched_upto - done <= window`` and the
message text of its rows in flight within ``window_bytes`` (both its part of its
workspace's windows, which grow with the row-workers' concurrency; one row larger than
that goes out alone, when nothing else of the job is in flight): it records the new
``dispatched_upto`` in the ledger and only then publishes those slices of consecutive
rows (confirmed), so a row is never out while the ledger holds it unreleased, and a
release the ledger refuses (the job was paused, canceled, taken over or stopped by its
budget) publishes nothing. A restart resumes where it left off; rows recorded as
released that never went out (a crash or a failed publish in between) are re-sent by
stall recovery. A job its budget stopped releases no more rows; it is kept (and re-sent
from, if rows it released are lost) until it ends.

Fair and prompt (see :mod:`relay_batches.services.dispatcher.sharing`): workspaces take
turns for slots, each workspace's releasing jobs share one window, and within a
workspace only its highest-priority jobs release rows; a queued job that outranks every
job of its workspace here is claimed even when the slots are full.

Offload (see :mod:`relay_batches.ledger.offload`): a job whose alias is led by a batch
deployment, adopted before any of its rows went out, without a budget, that may wait the
provider's window plus ``offload_margin_s`` (no completion window, or one at least that
long) is marked offloaded and has every row released in one ledger statement. Then it is
the offloader's: no slice of it is published, the dispatcher lets its lease go at once
(it takes no slot for the day its provider may take, nor part of any window) and no
dispatcher claims it again (an expired lease of an offloaded job is nobody's business;
stall recovery never judges it). A job marked before keeps its mark across restarts and
routes-file changes: claimed again (resumed after a pause), it is let go the same way.

No aio-pika or asyncpg here: the store and the publishers are passed in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from relay_batches.ledger.dispatch import ByteWindow, RunningJob, StalledJob
from relay_batches.messages import JobEvent, SliceMessage, SliceRow
from relay_batches.metrics import JOB_TRANSITIONS
from relay_batches.model import TERMINAL, JobStatus
from relay_batches.services.dispatcher.inflight import InFlight, SendLog
from relay_batches.services.dispatcher.recording import ResultsQueues, held_back
from relay_batches.services.dispatcher.sharing import (
    Windows,
    boost_for,
    byte_share,
    outranking_floors,
    releasing,
    window_share,
)

log = logging.getLogger("relay.dispatcher")

# A slice and its broker priority level (0..max_level, higher first).
PublishSlice = Callable[[SliceMessage, int], Awaitable[None]]
AnnounceFailed = Callable[[JobEvent], Awaitable[None]]
# ``(ready messages, consumers)`` of each results queue.
QueueState = Callable[[], Awaitable[ResultsQueues]]
# The batch deployment leading an alias and its provider's window (None: runs realtime).
OffloadLead = Callable[[str], tuple[str, timedelta] | None]
FETCH_SLICES = 16
MAX_SLICE_BYTES = 4 * 1024 * 1024
TOP_UP_FRACTION = 4


def slice_rows(
    rows: list[tuple[int, str]], max_rows: int, max_bytes: int
) -> list[list[tuple[int, str]]]:
    """Consecutive rows cut into slices of at most ``max_rows`` rows and (unless a
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

    async def claim_queued(
        self,
        owner: str,
        limit: int,
        lease_s: float,
        per_workspace: int = 0,
        floors: dict[str, int] | None = None,
    ) -> list[RunningJob]:
        """Claim queued jobs, the workspaces taking turns, none below ``floors``."""

    async def claim_outranking(
        self,
        owner: str,
        floors: dict[str, int],
        limit: int,
        lease_s: float,
        per_workspace: int = 0,
    ) -> list[RunningJob]:
        """Claim queued jobs above the highest priority we run of their workspace."""

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

    async def recording_silences(self) -> dict[str, float]:
        """Per running job with an outcome recorded, the seconds since its latest."""

    async def unfinished_rows(self, job_id: str, start: int, end: int) -> list[int]:
        """Indexes in ``start..end`` without an outcome."""

    async def fetch_rows_at(
        self, job_id: str, rows_batch_id: str, indexes: list[int]
    ) -> list[tuple[int, str]]:
        """Input rows at ``indexes`` that have no outcome yet."""

    async def byte_window(
        self, job_id: str, rows_batch_id: str, settled_below: int, upto: int, end: int
    ) -> ByteWindow:
        """Bytes of messages in flight and the sizes of the next rows."""

    async def advance(self, owner: str, job_id: str, upto: int) -> bool:
        """Record dispatched_upto."""

    async def fail(self, job_id: str, error: str) -> bool:
        """Fail a job as a whole."""

    async def offload(self, owner: str, job_id: str, total: int, deployment: str) -> bool:
        """Mark a job offloaded and release all its rows (once, before any release)."""


def offload_target(
    job: RunningJob, lead: OffloadLead, margin: timedelta, now: datetime
) -> str | None:
    """The batch deployment to offload ``job`` to, or None when it runs realtime: its
    alias is led by one, none of its rows went out yet, it has no budget (a budget
    withholds rows not yet released, and offload releases them all at once), and it may
    wait the provider's window plus ``margin`` (no deadline, or one at least that far
    from ``now``)."""
    found = lead(job.model)
    if found is None or job.dispatched_upto > 0 or job.budget_usd is not None:
        return None
    deployment, window = found
    if job.expires_at is not None and job.expires_at - now < window + margin:
        return None
    return deployment


@dataclass(frozen=True)
class DispatchConfig:
    """Tuning of one dispatcher."""

    owner: str
    window: int
    slice_rows: int
    max_running_jobs: int
    lease_s: float
    stall_s: float = 120.0
    max_running_per_workspace: int = 0
    max_level: int = 9
    window_bytes: int = 16 * 1024 * 1024
    window_max: int = 0  # 0: ``window`` (the window does not grow with the fleet)
    window_max_bytes: int = 0  # 0: ``window_bytes``
    offload_margin_s: float = 3600.0  # a job offloads only if it may wait window + this

    @property
    def windows(self) -> Windows:
        """A workspace's window bounds."""
        return Windows(
            self.window,
            self.window_bytes,
            max(self.window, self.window_max),
            max(self.window_bytes, self.window_max_bytes),
        )


@dataclass
class OwnedJob:
    """A job this dispatcher releases rows for."""

    job: RunningJob
    dispatched_upto: int
    done: int
    lock: asyncio.Lock
    sent: SendLog
    held: bool = False
    level: int = 0
    boost: int = 0
    settled_below: int = 0  # every row below has an outcome (where in-flight bytes start)
    # At least the bytes of its rows in flight (a ledger reading plus the rows released
    # since); None until read.
    flying: int | None = None

    @property
    def exhausted(self) -> bool:
        """Every row has been released, or its budget stopped it (nothing more goes)."""
        return self.dispatched_upto >= self.job.total or self.job.budget_stopped

    @property
    def in_flight(self) -> int:
        """Rows published that have no outcome yet (as far as this dispatcher knows)."""
        return max(0, self.dispatched_upto - self.done)


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
        *,
        inflight: InFlight | None = None,
        clock: Callable[[], float] = time.monotonic,
        results_state: QueueState | None = None,
        offload_lead: OffloadLead | None = None,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._store = store
        self._offload_lead = offload_lead
        self._wall_clock = wall_clock
        self._publish_slice = publish_slice
        self._announce_failed = announce_failed
        self._model_known = model_known
        self._config = config
        self._rows_waiting = rows_waiting
        self.inflight = inflight if inflight is not None else InFlight(config.owner)
        self._clock = clock
        self._results_state = results_state
        # The results queues behind at the last pass (of ``_behind_count`` shards).
        self._behind: frozenset[int] = frozenset()
        self._behind_count = 0
        self._started_at = clock()
        self._claiming = asyncio.Lock()
        self._stopped = False
        self.jobs: dict[str, OwnedJob] = {}

    @property
    def owner(self) -> str:
        """Our owner id: the jobs' ``lease_owner``, and the word our progress events are
        routed by."""
        return self._config.owner

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
        claimed = await self._claim_into_room()
        await self._adopt_all(claimed)
        outranking = await self._claim_outranking()
        await self._adopt_all(outranking)
        if outranking:
            # The jobs they outrank are parked now: their slots go round the workspaces.
            more = await self._claim_into_room()
            await self._adopt_all(more)
            claimed += more
        return len(claimed) + len(outranking)

    def _slots_taken(self) -> int:
        """Our jobs that take a running slot: every one but those parked behind a
        higher-priority job of their workspace (a parked job is its workspace's load
        in the ledger's turns and cap, but holds no slot)."""
        return sum(
            1 for owned in self.jobs.values() if owned in releasing(self._workspace_jobs(owned))
        )

    def _total_room(self) -> int:
        """Jobs we may still own: parked ones included, at most twice the slots."""
        return 2 * self._config.max_running_jobs - len(self.jobs)

    async def _claim_into_room(self) -> list[RunningJob]:
        """Orphaned jobs first, then queued ones in the workspaces' turn, up to our slots."""
        cfg = self._config
        room = min(cfg.max_running_jobs - self._slots_taken(), self._total_room())
        if room <= 0:
            return []
        claimed = await self._store.claim_expired(cfg.owner, room, cfg.lease_s)
        if len(claimed) < room:
            # A queued job below what we release for its workspace would only park.
            floors = outranking_floors(o.job for o in self.jobs.values() if not o.exhausted)
            claimed += await self._store.claim_queued(
                cfg.owner,
                room - len(claimed),
                cfg.lease_s,
                cfg.max_running_per_workspace,
                floors,
            )
        return claimed

    async def _claim_outranking(self) -> list[RunningJob]:
        """With every slot taken, claim queued jobs that outrank all of their workspace's
        jobs here: they release rows at once while those park, keeping their lease. The
        workspaces take turns and the per-workspace cap holds as in the queued claim; we
        own at most twice ``max_running_jobs`` jobs, parked ones included."""
        cfg = self._config
        room = self._total_room()
        if self._slots_taken() < cfg.max_running_jobs or room <= 0:
            return []
        floors = outranking_floors(owned.job for owned in self.jobs.values())
        return await self._store.claim_outranking(
            cfg.owner, floors, room, cfg.lease_s, cfg.max_running_per_workspace
        )

    async def _adopt_all(self, claimed: list[RunningJob]) -> None:
        """Take every claimed job in, then top them up: each workspace's part of our
        window is sized by every workspace we release for, so none is released under
        a part that a job claimed with it would have shrunk."""
        adopted = [
            owned
            for job in sorted(claimed, key=lambda j: -j.priority)
            if job.id not in self.jobs and (owned := await self._adopt(job)) is not None
        ]
        for owned in adopted:
            if owned.job.id in self.jobs:
                await self.top_up(owned)
        # Then once per workspace (not per job: a claim of many jobs of one workspace
        # walked all of them for each), the jobs there that no releasing job outranks.
        for workspace_id in dict.fromkeys(o.job.workspace_id for o in adopted):
            await self.resume_held(workspace_id)

    async def _adopt(self, job: RunningJob) -> OwnedJob | None:
        if not self._model_known(job.model):
            await self._fail(job, f"model alias {job.model!r} is not in the routes file")
            return None
        if await self._offloaded(job):
            return None
        JOB_TRANSITIONS.labels(JobStatus.RUNNING).inc()
        log.info(
            "job_claimed",
            extra={"batch_id": job.id, "total": job.total, "from_row": job.dispatched_upto},
        )
        owned = OwnedJob(job, job.dispatched_upto, job.done, asyncio.Lock(), SendLog(self._clock()))
        owned.level, owned.boost = boost_for(owned, self._workspace_jobs(owned))
        self.jobs[job.id] = owned
        return owned

    async def _offloaded(self, job: RunningJob) -> bool:
        """Whether ``job`` is not ours to release: offloaded before, or offloaded now
        (marked, every row released), or refused by the ledger while we offloaded it (no
        longer ours and running). An offloaded job's lease goes back at once."""
        target = job.offload_deployment
        if target is None and self._offload_lead is not None:
            margin = timedelta(seconds=self._config.offload_margin_s)
            target = offload_target(job, self._offload_lead, margin, self._wall_clock())
            if target is None:
                return False
            if not await self._store.offload(self._config.owner, job.id, job.total, target):
                log.info("job_offload_refused", extra={"batch_id": job.id})
                return True
            JOB_TRANSITIONS.labels(JobStatus.RUNNING).inc()
        if target is None:
            return False
        log.info("job_offloaded", extra={"batch_id": job.id, "deployment": target})
        await self._store.release(self._config.owner, [job.id])
        return True

    async def _fail(self, job: RunningJob, error: str) -> None:
        if await self._store.fail(job.id, error):
            JOB_TRANSITIONS.labels(JobStatus.FAILED).inc()
            log.warning("job_failed", extra={"batch_id": job.id, "error": error})
            await self._announce_failed(
                JobEvent(job.id, JobStatus.FAILED, job.total, job.completed, job.failed)
            )

    async def on_progress(self, event: JobEvent) -> None:
        """A job's counters moved: forget it if it is no longer running (it ended, or was
        paused: its rows already out still finish), else top up its window."""
        owned = self.jobs.get(event.batch_id)
        if owned is None:
            return
        if event.status != JobStatus.RUNNING:
            await self.drop(event.batch_id)
            if event.status not in TERMINAL:
                # Paused, or an event older than a resume after which we claimed the job
                # again: give the lease back (a no-op on a paused job, which has none),
                # so a running job is claimed again at the next pass, not a lease later.
                await self._store.release(self._config.owner, [event.batch_id])
            return
        owned.done = max(owned.done, event.completed + event.failed)
        await self.top_up(owned)
        if owned.exhausted:
            await self.resume_held(owned.job.workspace_id)

    async def resume_held(self, workspace_id: str) -> None:
        """Mark which of the workspace's jobs wait, and top up those that no releasing
        job outranks any more."""
        for other in list(self.jobs.values()):
            if other.job.workspace_id != workspace_id:
                continue
            was_held = other.held
            if self._may_release(other) and was_held:
                await self.top_up(other)

    def _workspace_jobs(self, owned: OwnedJob) -> list[OwnedJob]:
        """Our jobs of ``owned``'s workspace (``owned`` included if we hold it)."""
        workspace = owned.job.workspace_id
        return [o for o in self.jobs.values() if o.job.workspace_id == workspace]

    def _may_release(self, owned: OwnedJob) -> bool:
        """False (and the job marked held) while a higher-priority job of its workspace
        still has rows to release here."""
        owned.held = owned not in releasing(self._workspace_jobs(owned))
        return not owned.held

    def windows(self) -> tuple[int, int]:
        """``(rows, bytes)`` of one workspace's window now: our share of the live fleet's
        concurrency (split with the other live dispatchers), split between the
        workspaces we release for."""
        inflight = self.inflight
        return self._config.windows.for_fleet(
            inflight.fed_concurrency(self._config.slice_rows),
            inflight.dispatchers(),
            len(self._busy_workspaces()),
        )

    def _busy_workspaces(self) -> set[str]:
        """The workspaces we release rows for or still have rows of in the broker (the
        latter keep their part until those rows have outcomes)."""
        return {
            o.job.workspace_id for o in self.jobs.values() if not o.exhausted or o.in_flight > 0
        }

    def _broker_level(self, owned: OwnedJob, rows: int) -> int:
        """The broker priority of ``rows`` rows about to go out for ``owned``: its boost
        level while rows of lower jobs it overtook may still be queued, else 0."""
        if owned.boost <= 0:
            return 0
        owned.boost -= rows
        return min(owned.level, self._config.max_level)

    def forget(self, batch_id: str) -> OwnedJob | None:
        """Stop releasing rows of ``batch_id`` (ended, canceled, paused or no longer ours)."""
        owned = self.jobs.pop(batch_id, None)
        if owned is not None:
            log.info("job_released", extra={"batch_id": batch_id})
        return owned

    async def drop(self, batch_id: str) -> None:
        """:meth:`forget` ``batch_id`` and at once top up the jobs of its workspace that
        it kept parked."""
        owned = self.forget(batch_id)
        if owned is not None:
            await self.resume_held(owned.job.workspace_id)

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
        # Jobs parked behind one that went are topped up below (top_up marks them anew).
        for job in alive:
            owned = self.jobs.get(job.id)
            if owned is not None:
                owned.job = job  # its counters, and whether its budget stopped it
                owned.done = max(owned.done, job.done)
                await self.top_up(owned)

    async def recover_stalled(self) -> int:
        """Re-send the lost rows of each of our jobs that made no progress for a while.

        Every job is looked at on every pass, however deep the shared queue is. A row is
        lost when it has no outcome, no live row-worker holds it (heartbeats) and it is
        no longer queued: the queue is empty, or a slice published after it at its
        broker level or below was already delivered. Rows that are merely slow (held)
        or still waiting their turn are left alone, so they cost one upstream call.

        While the aggregator is behind on a results queue (nobody consumes it, or
        outcomes wait there while the ledger shows no outcome recorded for half a stall
        timeout of the running jobs that queue carries: its aggregator lost the ledger
        or is stuck, see :mod:`~relay_batches.services.dispatcher.recording`) the jobs
        whose outcomes it may carry are not judged (a shard's own jobs; every job for
        the unsharded queue): a row whose outcome a worker confirmed on its results
        shard is no longer held, and has no outcome in the ledger until the aggregator
        stores it. The jobs of the other shards are judged as usual, so one stuck shard
        holds back only its own. A busy aggregator that keeps recording, with a few
        messages always ready, is not behind. Once a queue caught up, the stall clocks
        of the jobs it held back restart (and only theirs): the outcomes it took last
        may still be on their way into the ledger, and a stall timeout later they are.
        """
        cfg = self._config
        if not self.jobs:
            return 0
        was_held = held_back(self.jobs, self._behind, self._behind_count)
        await self._probe_results()
        held = held_back(self.jobs, self._behind, self._behind_count)
        resumed = sorted(was_held - held)
        if resumed:
            await self._store.claim_stalled(cfg.owner, resumed, 0.0)
        judged = [job_id for job_id in self.jobs if job_id not in was_held | held]
        if not judged:
            return 0
        stalled = await self._store.claim_stalled(cfg.owner, judged, cfg.stall_s)
        found = [
            (self.jobs[job.id], job.first_unfinished)
            for job in stalled
            if job.id in self.jobs and job.first_unfinished is not None
        ]
        if found:
            queue_empty = self._rows_waiting is None or await self._rows_waiting() == 0
            for owned, first in found:
                await self._resend_lost(owned, first, queue_empty)
                await self.top_up(owned)
        return len(stalled)

    async def _probe_results(self) -> None:
        """Read which results queues are behind, those where outcomes may wait
        unrecorded (logged for the queues that fell behind or caught up); the ledger is
        read only when outcomes wait on a consumed queue."""
        if self._results_state is None:
            return
        queues = await self._results_state()
        unconsumed = queues.unconsumed()
        behind = set(unconsumed)
        if any(queue not in behind for queue in queues.waiting()):
            silences = await self._store.recording_silences()
            uptime = self._clock() - self._started_at
            behind.update(queues.silent(silences, uptime, self._config.stall_s / 2))
        fell, caught_up = behind - self._behind, self._behind - behind
        self._behind, self._behind_count = frozenset(behind), len(queues.shards)
        for action, shards, level in (
            ("stall_recovery_deferred", fell, logging.WARNING),
            ("stall_recovery_resumed", caught_up, logging.INFO),
        ):
            if shards:
                log.log(
                    level,
                    action,
                    extra={
                        "shards": sorted(shards),  # shard indexes, -1 the unsharded queue
                        "behind": sorted(behind),
                        "held_back": len(held_back(self.jobs, behind, len(queues.shards))),
                        "results_ready": queues.ready,
                        "unconsumed": unconsumed,
                    },
                )

    async def _resend_lost(self, owned: OwnedJob, first: int, queue_empty: bool) -> int:
        """Publish again the rows of ``owned`` from ``first`` that are lost; return how many."""
        job = owned.job
        async with owned.lock:
            unfinished = await self._store.unfinished_rows(job.id, first, owned.dispatched_upto)
            held = self.inflight.held(job.id)
            lost = [
                i
                for i in unfinished
                if i not in held
                and (queue_empty or self.inflight.delivered_after(*owned.sent.sent(i)))
            ]
            log.log(
                logging.WARNING if lost else logging.INFO,
                "job_stalled" if lost else "job_waiting",
                extra={
                    "batch_id": job.id,
                    "from_row": first,
                    "unfinished": len(unfinished),
                    "held": len(held),
                    "lost": len(lost),
                    "stall_s": self._config.stall_s,
                },
            )
            step = self._config.slice_rows * FETCH_SLICES
            for at in range(0, len(lost), step):
                rows = await self._store.fetch_rows_at(
                    job.id, job.rows_batch_id, lost[at : at + step]
                )
                await self._publish_rows(owned, rows)
        return len(lost)

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

        Rows go out in steps of at least a quarter window (or one slice, or the rest of
        the job), so a stream of small progress events costs few ledger reads. The bytes
        in flight are kept as an upper bound (``OwnedJob.flying``: the last reading from
        the ledger plus every row released since; outcomes recorded meanwhile only make
        it high), so a step reads only the sizes of the rows it may release; the ledger
        is read again only when that bound would hold a release back.
        """
        if not self._may_release(owned):
            return
        # The job's parts of its workspace's windows, once per top-up (not per step).
        rows_window, bytes_window = self.windows()
        workspace_jobs = self._workspace_jobs(owned)
        window = window_share(rows_window, self._config.slice_rows, workspace_jobs)
        budget = byte_share(bytes_window, workspace_jobs)
        step = max(self._config.slice_rows, window // TOP_UP_FRACTION)
        async with owned.lock:
            while not owned.exhausted and owned.job.id in self.jobs:
                room = owned.done + window - owned.dispatched_upto
                if room < min(step, owned.job.total - owned.dispatched_upto):
                    return
                end = await self._window_end(owned, room, budget)
                if end <= owned.dispatched_upto:
                    return  # the job's byte window is full
                if not await self._release_rows(owned, end):
                    self.forget(owned.job.id)
                    return

    async def _window_end(self, owned: OwnedJob, room: int, budget: int) -> int:
        """Where the next release stops: ``room`` rows at most (a few whole slices), and
        no further than ``budget``, the job's part of its workspace's byte window (sizes
        from the ledger). The bytes in flight are ``owned.flying`` (an upper bound) while it
        lets the release through whole; when unknown, or when it would stop the release
        short, they are read from the ledger (the anti-join over the rows in flight).
        ``owned.flying`` then counts the rows up to the stop (what goes out next)."""
        job, size = owned.job, self._config.slice_rows
        start = owned.dispatched_upto
        count = min(room, size * FETCH_SLICES)
        if start + count < job.total:
            count -= count % size
        end = min(job.total, start + count)
        if owned.flying is not None:
            window = await self._store.byte_window(job.id, job.rows_batch_id, start, start, end)
            stop = byte_window_end(owned.flying, window.next_rows, start, end, budget)
            if stop < end:
                owned.flying = None  # the bound holds rows back: read what is really out
        if owned.flying is None:
            window = await self._store.byte_window(
                job.id, job.rows_batch_id, owned.settled_below, start, end
            )
            owned.flying = window.in_flight
            owned.settled_below = (
                start if window.first_unfinished is None else window.first_unfinished
            )
            stop = byte_window_end(owned.flying, window.next_rows, start, end, budget)
        owned.flying += sum(n for i, n in window.next_rows if i < stop)
        return stop

    async def _release_rows(self, owned: OwnedJob, end: int) -> bool:
        """Release rows from ``dispatched_upto`` to ``end`` (a few slices): record the
        release in the ledger, then publish them. False, with nothing published, if the
        ledger refused (the job is no longer ours and running, or its budget stopped it).

        If the publish fails the rows stay released: stall recovery re-sends them (their
        send stamp is taken before the publish, so a slice of ours delivered after it
        shows they are not queued)."""
        job, start = owned.job, owned.dispatched_upto
        rows = await self._store.fetch_rows(job.id, job.rows_batch_id, start, end)
        if not await self._store.advance(self._config.owner, job.id, end):
            return False
        owned.dispatched_upto = end
        await self._publish_rows(owned, rows)
        return True

    async def _publish_rows(self, owned: OwnedJob, rows: list[tuple[int, str]]) -> None:
        """Publish ``rows`` of a job as slices (confirmed), stamped with our owner id and
        the time they went out on our clock (what stall recovery compares with the
        workers' delivery marks of our own slices). The send log takes the stamp before
        the publish: a row whose publish failed (never out) then counts as lost once a
        slice we published after it was delivered, and one that went out is judged by
        its own stamp."""
        if not rows:
            return
        job, sent_at = owned.job, self._clock()
        slices = slice_rows(rows, self._config.slice_rows, MAX_SLICE_BYTES)
        level = self._broker_level(owned, len(rows))
        owned.sent.record(rows[0][0], rows[-1][0] + 1, sent_at, level)
        await asyncio.gather(
            *(
                self._publish_slice(
                    SliceMessage(
                        job.id,
                        job.model,
                        tuple(SliceRow(i, m) for i, m in part),
                        job.params,
                        level,
                        sent_at,
                        self._config.owner,
                        job.expires_at.timestamp() if job.expires_at else 0.0,
                        job.workspace_id,
                    ),
                    level,
                )
                for part in slices
            )
        )
