"""Claiming jobs: queued and orphaned ones into the room our slots leave, a
queued job that outranks every job of its workspace here even when they are full; each
adopted (or, led by a batch deployment, offloaded and let go at once)."""

from __future__ import annotations

import asyncio
import logging
import time

from relay_batches.ledger.dispatch import RunningJob
from relay_batches.messages import JobEvent
from relay_batches.metrics import JOB_QUEUE_WAIT, JOB_TRANSITIONS
from relay_batches.model import JobStatus
from relay_batches.services.dispatcher.inflight import SendLog
from relay_batches.services.dispatcher.release import Release
from relay_batches.services.dispatcher.sharing import (
    boost_for,
    newcomer_boost,
    outranking_floors,
    releasing,
)
from relay_batches.services.dispatcher.state import OwnedJob
from relay_batches.services.dispatcher.traced import claim_span

log = logging.getLogger("relay.dispatcher")


class Claiming(Release):
    """The dispatcher's claims: jobs taken into its room and adopted."""

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
        started_ns = time.time_ns()  # a traced job's claim span starts here
        claimed = await self._claim_into_room()
        await self._adopt_all(claimed, started_ns)
        outranking = await self._claim_outranking()
        await self._adopt_all(outranking, started_ns)
        if outranking:
            # The jobs they outrank are parked now: their slots go round the workspaces.
            more = await self._claim_into_room()
            await self._adopt_all(more, started_ns)
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
            queued = await self._store.claim_queued(
                cfg.owner,
                room - len(claimed),
                cfg.lease_s,
                cfg.max_running_per_workspace,
                floors,
            )
            observe_queue_wait(queued)
            claimed += queued
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
        claimed = await self._store.claim_outranking(
            cfg.owner, floors, room, cfg.lease_s, cfg.max_running_per_workspace
        )
        observe_queue_wait(claimed)
        return claimed

    async def _adopt_all(self, claimed: list[RunningJob], started_ns: int) -> None:
        """Take every claimed job in, then top them up: each workspace's part of our
        window is sized by every workspace we release for, so none is released under
        a part that a job claimed with it would have shrunk."""
        adopted = [
            owned
            for job in sorted(claimed, key=lambda j: -j.priority)
            if job.id not in self.jobs and (owned := await self._adopt(job, started_ns)) is not None
        ]
        for owned in adopted:
            if owned.job.id in self.jobs:
                await self.top_up(owned)
        # Then once per workspace (not per job: a claim of many jobs of one workspace
        # walked all of them for each), the jobs there that no releasing job outranks.
        for workspace_id in dict.fromkeys(o.job.workspace_id for o in adopted):
            await self.resume_held(workspace_id)

    async def _adopt(self, job: RunningJob, started_ns: int) -> OwnedJob | None:
        if not self._model_known(job.model):
            await self._fail(job, f"model alias {job.model!r} is not in the routes file")
            return None
        if await self._offloaded(job):
            return None
        JOB_TRANSITIONS.labels(JobStatus.RUNNING).inc()
        claim_span(job, started_ns)
        log.info(
            "job_claimed",
            extra={"batch_id": job.id, "total": job.total, "from_row": job.dispatched_upto},
        )
        owned = OwnedJob(job, job.dispatched_upto, job.done, asyncio.Lock(), SendLog(self._clock()))
        owned.level, owned.boost = max(
            boost_for(owned, self._workspace_jobs(owned)),
            newcomer_boost(owned, self.jobs.values()),
        )
        self.jobs[job.id] = owned
        return owned

    async def _offloaded(self, job: RunningJob) -> bool:
        """Whether ``job`` is not ours to release: offloaded before, or offloaded now
        (marked, every row released), or refused by the ledger while we offloaded it (no
        longer ours and running). An offloaded job's lease goes back at once."""
        target = job.offload_deployment
        if target is None and self._plan_lanes is not None:
            target = await self._plan_lanes(job)
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


def observe_queue_wait(claimed: list[RunningJob]) -> None:
    """Observe each job's wait from its creation to this claim, its first: a job claimed
    from ``queued`` that was never paused (a resumed job keeps its first claim's
    ``started_at``, and was observed then)."""
    for job in claimed:
        if job.pauses == 0 and job.created_at is not None and job.started_at is not None:
            JOB_QUEUE_WAIT.observe(max(0.0, (job.started_at - job.created_at).total_seconds()))
