"""Releasing rows: claim jobs, keep a bounded window of each job's rows in the broker.

For every job it owns, the dispatcher keeps ``dispatched_upto - done <= window`` and the
message text of its rows in flight within ``window_bytes`` (both its part of its
workspace's windows, which grow with the row-workers' concurrency and, paced by the
job's time per row, hold a few seconds of work, see
:mod:`~relay_batches.services.dispatcher.pacing`; one row larger than
that goes out alone, when nothing else of the job is in flight): it records the new
``dispatched_upto`` in the ledger and only then publishes those slices of consecutive
rows (confirmed), so a row is never out while the ledger holds it unreleased, and a
release the ledger refuses (the job was paused, canceled, taken over or stopped by its
budget) publishes nothing. A restart resumes where it left off; rows recorded as
released that never went out (a crash or a failed publish in between) are re-sent by
stall recovery. A job with a budget releases only the rows what is left of it pays for
at an estimated cost per row (see :mod:`~relay_batches.services.dispatcher.budget`); a
job its budget stopped releases no more rows; it is kept (and re-sent from, if rows it
released are lost) until it ends. Rows that row-workers handed back unstarted (a pause,
see :mod:`relay_batches.services.row_worker.controls`) go out again first, once.

Fair and prompt (see :mod:`relay_batches.services.dispatcher.sharing`): workspaces take
turns for slots, each workspace's releasing jobs share one window, and within a
workspace only its highest-priority jobs release rows; a queued job that outranks every
job of its workspace here is claimed even when the slots are full.

Offload (see :mod:`relay_batches.ledger.offload`): a job whose alias is led by a batch
deployment, adopted before any of its rows went out, whose lane plan
(``plan_lanes``, :mod:`relay_batches.services.dispatcher.lanes`) starts it in the batch
lane is marked offloaded and has every row released in one ledger statement. Then it is
the offloader's: no slice of it is published, the dispatcher lets its lease go at once
(it takes no slot for the day its provider may take, nor part of any window) and no
dispatcher claims it again (an expired lease of an offloaded job is nobody's business;
stall recovery never judges it). A job marked before keeps its mark across restarts and
routes-file changes: claimed again (resumed after a pause), it is let go the same way.

No aio-pika or asyncpg here: the store and the publishers are passed in.
"""

from __future__ import annotations

import logging

from relay_batches.services.dispatcher.claiming import Claiming
from relay_batches.services.dispatcher.recovery import Recovery
from relay_batches.services.dispatcher.state import (
    FETCH_SLICES,
    MAX_SLICE_BYTES,
    AnnounceFailed,
    DispatchConfig,
    OwnedJob,
    PlanLanes,
    PublishSlice,
    QueueState,
    Store,
    byte_window_end,
    slice_rows,
)

__all__ = [
    "FETCH_SLICES",
    "MAX_SLICE_BYTES",
    "AnnounceFailed",
    "DispatchConfig",
    "Dispatcher",
    "OwnedJob",
    "PlanLanes",
    "PublishSlice",
    "QueueState",
    "Store",
    "byte_window_end",
    "slice_rows",
]

log = logging.getLogger("relay.dispatcher")


class Dispatcher(Claiming, Recovery):
    """Claims jobs and tops up each one's window of rows in the broker: its claims
    (:mod:`~relay_batches.services.dispatcher.claiming`), releases
    (:mod:`~relay_batches.services.dispatcher.release`) and stall recovery
    (:mod:`~relay_batches.services.dispatcher.recovery`) over one
    :class:`~relay_batches.services.dispatcher.state.DispatcherState`."""

    async def reconcile(self) -> None:
        """One reconcile pass: claim, renew every lease (topping windows up), recover
        stalled jobs."""
        await self.claim()
        await self.renew()
        await self.recover_stalled()

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
