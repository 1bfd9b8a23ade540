"""The offloader's watch over submitted provider batches (see :mod:`relay_batches.lanes`):

- **insurance** — a batch with no progress for :func:`~relay_batches.lanes.plan.stall_after_s`
  of its deployment's expected turnaround (declared, then learned from its finished
  batches) is stalled;
- **the ramp** — a batch whose rows still waiting could only just be answered by the
  alias's faster lanes (flex and realtime, at their rows a second) before the earliest
  deadline among their jobs (:func:`~relay_batches.lanes.plan.must_move`).

Either way its rows move to the fast lanes at once (forwarded as ordinary rows) and the
provider batch is canceled; an answer it gives later for a moved row is discarded.
"""

from __future__ import annotations

from relay_batches.lanes.offers import learned_turnaround, offer_of
from relay_batches.lanes.plan import LaneOffer, must_move, stall_after_s
from relay_batches.ledger.offload import OffloadBatch, OffloadStore
from relay_batches.router.aliases import AliasTable

STALLED = "stalled"
RAMP = "ramp"


class LaneWatch:
    """Judges submitted provider batches: stalled, due for the ramp, or neither."""

    def __init__(self, store: OffloadStore, aliases: AliasTable) -> None:
        self._store = store
        self._declared: dict[str, float] = {}
        self._fast: dict[str, list[LaneOffer]] = {}
        for alias in aliases.names():
            lead = aliases.batch_lead(alias)
            if lead is None or lead.batch is None or lead.name in self._fast:
                continue
            self._declared[lead.name] = lead.batch.turnaround.total_seconds()
            self._fast[lead.name] = [
                offer_of(d) for d in aliases.resolve(alias) or () if d.batch is None
            ]

    async def verdict(self, batch: OffloadBatch) -> str | None:
        """:data:`STALLED`, :data:`RAMP` or None for a submitted provider batch."""
        declared = self._declared.get(batch.deployment)
        if declared is None:
            return None
        watch = await self._store.watch(batch.id)
        if watch is None or watch.rows_left == 0:
            return None
        turnaround = learned_turnaround(declared, await self._store.turnarounds(batch.deployment))
        if watch.quiet_s >= stall_after_s(turnaround):
            return STALLED
        fast = self._fast[batch.deployment]
        if fast and watch.seconds_left is not None:
            if must_move(watch.rows_left, watch.seconds_left, fast):
                return RAMP
        return None
