"""Moving a provider batch's rows to the faster lanes before it ended (the ramp near a
deadline, or a stalled batch: see :mod:`relay_batches.lanes`), and keeping a row paid
once: an answer the provider batch gives later for a row moved is discarded, counted in
its job's ``late_answers``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from relay_batches.ledger.offload.records import (
    ENDED,
    FORWARD_SUBMITTED,
    BatchState,
    PoolStore,
    RowState,
)
from relay_batches.ledger.pool import translated


@dataclass(frozen=True, slots=True)
class Watch:
    """What the ramp and the insurance read of one submitted provider batch: seconds
    since its submit and since its last progress (its submit when none), its rows still
    waiting for it, and seconds to the earliest deadline among their jobs (None: none
    has one)."""

    submitted_s: float
    quiet_s: float
    rows_left: int
    seconds_left: float | None
    moved: str | None = None  # why its rows moved already (its cancel may be due again)


class Moving(PoolStore):
    """The ledger side of moving lanes."""

    async def watch(self, offload_id: int) -> Watch | None:
        """The :class:`Watch` of a submitted provider batch (None: not submitted)."""
        async with translated():
            record = await self._pool.fetchrow(_WATCH, offload_id, RowState.SUBMITTED)
        if record is None or record[0] is None:
            return None
        return Watch(float(record[0]), float(record[1]), int(record[2]), record[3], record[4])

    async def move(self, offload_id: int, owner: str, reason: str) -> int:
        """Its rows still submitted go to the faster lanes (``forward``; dropped if their
        job ended), the record noting when and why, in one transaction and only while
        it is ours; how many rows moved. The provider batch itself goes on (cancel it)."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            ours = await conn.fetchval(
                "UPDATE offload_batches SET moved_at = now(), moved_reason = $3"
                " WHERE id = $1 AND owner = $2 AND moved_at IS NULL"
                " AND state = ANY($4::text[]) RETURNING id",
                offload_id,
                owner,
                reason,
                [BatchState.SUBMITTED, BatchState.CANCELING],
            )
            if ours is None:
                return 0
            status = await conn.execute(FORWARD_SUBMITTED, offload_id, RowState.SUBMITTED, ENDED)
        return int(status.split()[-1])

    async def still_submitted(
        self, keys: Sequence[tuple[str, int]]
    ) -> tuple[set[tuple[str, int]], int]:
        """Of the rows ``keys`` a provider batch answered, those still waiting for it
        (their answer may be recorded), and how many had moved to another lane (their
        answer is discarded: each counted in its job's ``late_answers``)."""
        if not keys:
            return set(), 0
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            records = await conn.fetch(
                "SELECT o.batch_id, o.row_index, o.state FROM offload_rows o"
                " JOIN unnest($1::text[], $2::int[]) AS k(batch_id, row_index)"
                " ON o.batch_id = k.batch_id AND o.row_index = k.row_index",
                [k[0] for k in keys],
                [k[1] for k in keys],
            )
            waiting = {(r[0], r[1]) for r in records if r[2] == RowState.SUBMITTED}
            moved = [r[0] for r in records if r[2] in (RowState.FORWARD, RowState.FORWARDED)]
            if moved:
                await conn.execute(
                    "UPDATE batches b SET late_answers = b.late_answers + m.n"
                    " FROM (SELECT id, count(*) AS n FROM unnest($1::text[]) AS t(id)"
                    " GROUP BY id) m WHERE b.id = m.id",
                    moved,
                )
        return waiting, len(moved)


_WATCH = (
    "SELECT extract(epoch FROM now() - s.submitted_at),"
    " extract(epoch FROM now() - COALESCE(s.progressed_at, s.submitted_at)),"
    " (SELECT count(*) FROM offload_rows o WHERE o.provider_batch = s.id AND o.state = $2),"
    " (SELECT extract(epoch FROM min(b.expires_at) - now())::float8"
    "  FROM offload_rows o JOIN batches b ON b.id = o.batch_id"
    "  WHERE o.provider_batch = s.id AND o.state = $2),"
    " s.moved_reason"
    " FROM offload_batches s WHERE s.id = $1"
)
