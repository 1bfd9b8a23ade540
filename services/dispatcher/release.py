"""Releasing rows: each owned job's window of rows topped up in the broker
(ledger first, then the confirmed publish), the jobs of a workspace parked behind its
highest-priority ones, a job forgotten when it ends or is no longer ours."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from relay_batches.messages import JobEvent, SliceMessage, SliceRow
from relay_batches.model import TERMINAL, JobStatus
from relay_batches.prefixes import grouped
from relay_batches.services.dispatcher.budget import rows_within_budget
from relay_batches.services.dispatcher.pacing import paced_window, slice_size
from relay_batches.services.dispatcher.sharing import (
    byte_share,
    releasing,
    window_share,
)
from relay_batches.services.dispatcher.state import (
    FETCH_SLICES,
    MAX_SLICE_BYTES,
    TOP_UP_FRACTION,
    DispatcherState,
    OwnedJob,
    byte_window_end,
    slice_rows,
)
from relay_batches.services.dispatcher.traced import release_span

log = logging.getLogger("relay.dispatcher")


def _request_text(row: tuple[int, str]) -> str:
    return row[1]


class Release(DispatcherState):
    """The dispatcher's releases: each owned job's window of rows kept topped up."""

    async def on_progress(self, event: JobEvent) -> None:
        """A job's counters moved: forget it if it is no longer running (it ended, or was
        paused: its rows already out still finish), else top up its window."""
        owned = self.jobs.get(event.batch_id)
        if owned is None:
            return
        self.paces.observe(event.batch_id, event.latency_ms)
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

    def windows(self, owned: OwnedJob) -> tuple[int, int]:
        """``(rows, bytes)`` of one workspace's window now: our share of the live fleet's
        concurrency (split with the other live dispatchers), split between the
        workspaces we release for; when paced, no more rows than ``owned``'s pace asks
        (:func:`~relay_batches.services.dispatcher.pacing.paced_window`)."""
        inflight = self.inflight
        rows, size = self._config.windows.for_fleet(
            inflight.fed_concurrency(self._config.slice_rows),
            inflight.dispatchers(),
            len(self._busy_workspaces()),
        )
        if not self._config.paced:
            return rows, size
        paced = paced_window(
            self._latency_s(owned),
            inflight.concurrencies(),
            self.slice_for(owned),
            self._config.slice_rows,
            inflight.dispatchers(),
        )
        return min(rows, paced), size

    def _latency_s(self, owned: OwnedJob) -> float | None:
        """Seconds per row of ``owned`` as learned from its outcomes (None: not yet)."""
        return self.paces.latency_s(owned.job.id)

    def slice_for(self, owned: OwnedJob, going: int = 0) -> int:
        """Rows per slice of ``owned`` now: about a second of work held ahead by a worker
        (:func:`~relay_batches.services.dispatcher.pacing.slice_size`), its rows left
        being those not released yet (and the ``going`` rows being published)."""
        if not self._config.paced:
            return self._config.slice_rows
        return slice_size(
            self._latency_s(owned),
            self.inflight.concurrencies(),
            self._config.slice_rows,
            owned.job.total - owned.dispatched_upto + going,
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
        self.paces.forget(batch_id)
        if owned is not None:
            log.info("job_released", extra={"batch_id": batch_id})
        return owned

    async def drop(self, batch_id: str) -> None:
        """:meth:`forget` ``batch_id`` and at once top up the jobs of its workspace that
        it kept parked."""
        owned = self.forget(batch_id)
        if owned is not None:
            await self.resume_held(owned.job.workspace_id)

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
        rows_window, bytes_window = self.windows(owned)
        workspace_jobs = self._workspace_jobs(owned)
        size = self.slice_for(owned)
        window = window_share(rows_window, size, workspace_jobs)
        budget = byte_share(bytes_window, workspace_jobs)
        step = max(size, window // TOP_UP_FRACTION)
        async with owned.lock:
            if owned.job.returned:
                await self._release_returned(owned)
            while not owned.exhausted and owned.job.id in self.jobs:
                room = owned.done + window - owned.dispatched_upto
                if room < min(step, owned.job.total - owned.dispatched_upto):
                    return
                end = await self._window_end(owned, room, budget)
                if end <= owned.dispatched_upto:
                    return  # the job's byte window is full
                upto = owned.dispatched_upto
                if not await self._release_rows(owned, end):
                    self.forget(owned.job.id)
                    return
                if owned.dispatched_upto == upto:
                    return  # its budget pays for no more rows now

    async def _window_end(self, owned: OwnedJob, room: int, budget: int) -> int:
        """Where the next release stops: ``room`` rows at most (a few whole slices), and
        no further than ``budget``, the job's part of its workspace's byte window (sizes
        from the ledger). The bytes in flight are ``owned.flying`` (an upper bound) while it
        lets the release through whole; when unknown, or when it would stop the release
        short, they are read from the ledger (the anti-join over the rows in flight).
        ``owned.flying`` then counts the rows up to the stop (what goes out next)."""
        job, size = owned.job, self.slice_for(owned)
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
        A job with a budget releases only the rows its budget left pays for at the
        estimated cost per row (:mod:`~relay_batches.services.dispatcher.budget`): maybe
        fewer, or none (True, nothing released: it waits for outcomes).

        If the publish fails the rows stay released: stall recovery re-sends them (their
        send stamp is taken before the publish, so a slice of ours delivered after it
        shows they are not queued)."""
        job, start = owned.job, owned.dispatched_upto
        rows = await self._store.fetch_rows(job.id, job.rows_batch_id, start, end)
        if job.budget_usd is not None:
            allowed = rows_within_budget(
                job, start, owned.in_flight, [len(r) for _, r in rows], self._price_of(job.model)
            )
            if allowed < len(rows):
                rows, end = rows[:allowed], (rows[allowed][0] if allowed else start)
            if end <= start:
                return True
        if not await self._store.advance(self._config.owner, job.id, end):
            return False
        owned.dispatched_upto = end
        await self._publish_rows(owned, rows)
        return True

    async def _release_returned(self, owned: OwnedJob) -> None:
        """Release again, first, the rows row-workers handed back unstarted (the job was
        paused): marked taken in the ledger's ``returned_rows`` in one statement, then
        published. They are below ``dispatched_upto`` and already count in the window."""
        rows = await self._store.take_returned(self._config.owner, owned.job.id)
        owned.job = replace(owned.job, returned=False)
        if rows:
            log.info("returned_rows_released", extra={"batch_id": owned.job.id, "rows": len(rows)})
            await self._publish_rows(owned, rows)

    async def _publish_rows(
        self, owned: OwnedJob, rows: list[tuple[int, str]], *, resent: bool = False
    ) -> None:
        """Publish ``rows`` of a job as slices (confirmed), marked ``resent`` when stall
        recovery sends them again (a worker then first drops those that got an outcome
        meanwhile), stamped with our owner id and
        the time they went out on our clock (what stall recovery compares with the
        workers' delivery marks of our own slices). The send log takes the stamp before
        the publish: a row whose publish failed (never out) then counts as lost once a
        slice we published after it was delivered, and one that went out is judged by
        its own stamp."""
        if not rows:
            return
        job, sent_at = owned.job, self._clock()
        first, last = rows[0][0], rows[-1][0]  # rows come in index order
        if self._config.group_prefixes:
            rows = grouped(rows, _request_text)
        slices = slice_rows(rows, self.slice_for(owned, len(rows)), MAX_SLICE_BYTES)
        level = self._broker_level(owned, len(rows))
        owned.sent.record(first, last + 1, sent_at, level)
        await asyncio.gather(
            *(
                self._release_slice(
                    owned,
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
                        pauses=job.pauses,
                        resent=resent,
                    ),
                    level,
                )
                for part in slices
            )
        )
        if level > owned.announced_level:
            await self._announce_overtaken(owned, level)

    async def _release_slice(self, owned: OwnedJob, job_slice: SliceMessage, level: int) -> None:
        """Publish one slice; a traced job's in a release span, whose context it carries."""
        with release_span(owned.job, job_slice) as trace:
            if trace is None:
                await self._publish_slice(job_slice, level)
            else:
                await self._publish_slice(job_slice, level, trace)

    async def _announce_overtaken(self, owned: OwnedJob, level: int) -> None:
        """Tell the row-workers that ``owned``'s rows are queued at ``level``: each hands
        back the rows it holds, not started, of lower slices, so the broker delivers
        these at once instead of after a slice it holds ends. Published after the rows
        (confirmed), so the rows handed back queue behind them. Best effort: if it is
        lost, the rows start when the workers' held slices end, as without it."""
        owned.announced_level = level
        if self._announce_overtaking is None:
            return
        event = JobEvent(owned.job.id, JobStatus.RUNNING, owned.job.total, 0, 0, level=level)
        try:
            await self._announce_overtaking(event)
        except Exception as exc:
            log.warning(
                "overtaking_not_announced", extra={"batch_id": owned.job.id, "error": repr(exc)}
            )
