"""Stall recovery: the rows of our jobs that made no progress for a while and
that nobody holds or queues any more are sent again."""

from __future__ import annotations

import logging

from relay_batches.services.dispatcher.recording import held_back
from relay_batches.services.dispatcher.release import Release
from relay_batches.services.dispatcher.state import FETCH_SLICES, OwnedJob

log = logging.getLogger("relay.dispatcher")


class Recovery(Release):
    """The dispatcher's stall recovery: lost rows of quiet jobs sent again."""

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
        if self._sight_lost:
            return await self._regain_sight()
        was_held = held_back(self.jobs, self._behind, self._behind_count)
        await self._probe_results()
        held = held_back(self.jobs, self._behind, self._behind_count)
        # Where each job's walk to its first unfinished row starts.
        settled = {job_id: owned.settled_below for job_id, owned in self.jobs.items()}
        resumed = sorted(was_held - held)
        if resumed:
            await self._store.claim_stalled(cfg.owner, resumed, 0.0, settled)
        judged = [job_id for job_id in self.jobs if job_id not in was_held | held]
        if not judged:
            return 0
        stalled = await self._store.claim_stalled(cfg.owner, judged, cfg.stall_s, settled)
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

    def sight_lost(self) -> None:
        """Our broker connection dropped (called synchronously as it drops)."""
        self._sight_lost = True

    async def _regain_sight(self) -> int:
        """After our broker connection dropped nothing is judged: no heartbeat reached
        us meanwhile, and the broker put the slices its workers held back in the queue,
        from which they go out again as soon as the workers reconnect (neither held
        nor queued for a moment). So once we are connected again every job's stall
        clock restarts, and rows are judged a stall period later, on fresh heartbeats;
        re-sent at once, a row merely in transit would be paid for twice."""
        if not self._connected():
            return 0
        self._sight_lost = False
        await self._store.claim_stalled(self._config.owner, list(self.jobs), 0.0)
        log.info("stall_clocks_restarted", extra={"jobs": len(self.jobs)})
        return 0

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
                await self._publish_rows(owned, rows, resent=True)
        return len(lost)
