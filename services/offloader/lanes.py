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

import time
from collections.abc import Callable

from relay_batches.lanes.offers import learned_turnaround, offers_for
from relay_batches.lanes.plan import LaneOffer, must_move, stall_after_s
from relay_batches.ledger.lane_rates import measured_rates
from relay_batches.ledger.offload import OffloadBatch, OffloadStore
from relay_batches.router.aliases import AliasTable

STALLED = "stalled"
RAMP = "ramp"
MEASURE_EVERY_S = 30.0  # how long a lead alias's measured fast-lane rates are kept


class LaneWatch:
    """Judges submitted provider batches: stalled, due for the ramp, or neither."""

    def __init__(
        self,
        store: OffloadStore,
        aliases: AliasTable,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._aliases = aliases
        self._clock = clock
        self._declared: dict[str, float] = {}
        self._alias: dict[str, str] = {}  # batch deployment -> the first alias it leads
        self._fast: dict[str, tuple[float, list[LaneOffer]]] = {}  # alias -> (when, offers)
        for alias in aliases.names():
            lead = aliases.batch_lead(alias)
            if lead is None or lead.batch is None or lead.name in self._alias:
                continue
            self._declared[lead.name] = lead.batch.turnaround.total_seconds()
            self._alias[lead.name] = alias

    async def _fast_offers(self, alias: str) -> list[LaneOffer]:
        """The alias's flex and realtime offers, their measured rates read at most every
        :data:`MEASURE_EVERY_S`."""
        now = self._clock()
        held = self._fast.get(alias)
        if held is None or now - held[0] >= MEASURE_EVERY_S:
            measured = await self._store_rates(alias)
            offers = [
                o for o in offers_for(self._aliases, alias, None, measured) if o.lane != "batch"
            ]
            held = self._fast[alias] = (now, offers)
        return held[1]

    async def _store_rates(self, alias: str) -> dict[str, float]:
        return await measured_rates(self._store.pool, [alias])

    async def verdict(self, batch: OffloadBatch) -> str | None:
        """:data:`STALLED`, :data:`RAMP` or None for a submitted provider batch (the
        reason its rows moved before, when they did: its cancel is tried again)."""
        declared = self._declared.get(batch.deployment)
        if declared is None:
            return None
        watch = await self._store.watch(batch.id)
        if watch is not None and watch.moved is not None:
            return watch.moved
        if watch is None or watch.rows_left == 0:
            return None
        turnaround = learned_turnaround(declared, await self._store.turnarounds(batch.deployment))
        if watch.quiet_s >= stall_after_s(turnaround):
            return STALLED
        fast = await self._fast_offers(self._alias[batch.deployment])
        if fast and watch.seconds_left is not None:
            if must_move(watch.rows_left, watch.seconds_left, fast):
                return RAMP
        return None
