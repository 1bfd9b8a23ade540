"""Settling and forwarding: the rows of an ended provider batch marked done
or sent realtime, and rows to forward published as ordinary realtime rows."""

from __future__ import annotations

from collections.abc import Sequence

from relay_batches.ledger.offload.records import (
    ENDED,
    FORWARD_SUBMITTED,
    BatchState,
    ForwardRow,
    PoolStore,
    PublishForward,
    RowState,
    forward_or_drop,
)
from relay_batches.ledger.pool import translated
from relay_batches.ledger.status_sql import status_in
from relay_batches.model import JobStatus


class Settling(PoolStore):
    """Settling a provider batch's rows and forwarding rows realtime."""

    # --- settling --------------------------------------------------------------------

    async def mark_rows(self, keys: Sequence[tuple[str, int]], state: RowState) -> int:
        """Move the submitted rows ``keys`` to ``state`` (done: their outcome was
        published; forward: they go realtime, or are dropped if their job ended); how
        many moved."""
        if not keys:
            return 0
        async with translated():
            status = await self._pool.execute(
                "UPDATE offload_rows o SET state = CASE WHEN $3 = 'forward'"
                f" THEN {forward_or_drop('$5')} ELSE $3 END"
                " FROM unnest($1::text[], $2::int[]) AS k(batch_id, row_index), batches b"
                " WHERE o.batch_id = k.batch_id AND o.row_index = k.row_index"
                " AND o.state = $4 AND b.id = o.batch_id",
                [k[0] for k in keys],
                [k[1] for k in keys],
                state,
                RowState.SUBMITTED,
                ENDED,
            )
        return int(status.split()[-1])

    async def mark_done(self, keys: Sequence[tuple[str, int]]) -> tuple[int, int]:
        """The submitted rows ``keys`` had their outcome published: ``done``. How many
        moved, and of those how many belong to jobs that ended meanwhile (late outcomes:
        the ledger discards them)."""
        if not keys:
            return 0, 0
        async with translated():
            records = await self._pool.fetch(
                "UPDATE offload_rows o SET state = $3"
                " FROM unnest($1::text[], $2::int[]) AS k(batch_id, row_index), batches b"
                " WHERE o.batch_id = k.batch_id AND o.row_index = k.row_index"
                " AND o.state = $4 AND b.id = o.batch_id"
                " RETURNING b.status = ANY($5::text[])",
                [k[0] for k in keys],
                [k[1] for k in keys],
                RowState.DONE,
                RowState.SUBMITTED,
                ENDED,
            )
        return len(records), sum(1 for r in records if r[0])

    async def settle(self, offload_id: int, owner: str) -> int:
        """Its results are all read: the record is ``settled`` and the rows it gave no
        outcome for are forwarded (dropped if their job ended), in one transaction, only
        while it is ours and ended; how many rows were forwarded or dropped."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            ours = await conn.fetchval(
                "UPDATE offload_batches SET state = $3, lease_until = NULL"
                " WHERE id = $1 AND owner = $2 AND state = $4 RETURNING id",
                offload_id,
                owner,
                BatchState.SETTLED,
                BatchState.ENDED,
            )
            if ours is None:
                return 0
            status = await conn.execute(FORWARD_SUBMITTED, offload_id, RowState.SUBMITTED, ENDED)
        return int(status.split()[-1])

    # --- forwarding --------------------------------------------------------------------

    async def forward(self, limit: int, max_bytes: int, publish: PublishForward) -> int:
        """Take up to ``limit`` rows of running jobs waiting to go realtime (a paused or
        queued job's wait for it to run again), their requests within
        ``max_bytes`` (the first whatever its size; locked SKIP LOCKED), hand
        them to ``publish`` (which returns once the broker confirmed them) and mark them
        ``forwarded`` in the same transaction: a crash before the commit publishes them
        again (a duplicate realtime call at worst; the outcome insert is idempotent)."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            records = await conn.fetch(_FORWARD_LOCK, limit, max_bytes)
            if not records:
                return 0
            await publish([ForwardRow(*r) for r in records])
            await conn.execute(
                "UPDATE offload_rows o SET state = $3"
                " FROM unnest($1::text[], $2::int[]) AS k(batch_id, row_index)"
                " WHERE o.batch_id = k.batch_id AND o.row_index = k.row_index",
                [r[0] for r in records],
                [r[1] for r in records],
                RowState.FORWARDED,
            )
        return len(records)


# rows that wait are never read.
_FORWARD_LOCK = (
    "WITH taken AS (SELECT o.batch_id, o.row_index, o.bytes"
    "  FROM batches b CROSS JOIN LATERAL (SELECT o.batch_id, o.row_index, o.bytes"
    "   FROM offload_rows o"
    f"   WHERE o.batch_id = b.id AND o.state = '{RowState.FORWARD}'"
    "   ORDER BY o.row_index LIMIT $1 FOR UPDATE SKIP LOCKED) o"
    f"  WHERE b.offload_deployment IS NOT NULL AND b.{status_in([JobStatus.RUNNING])}"
    "  ORDER BY b.id, o.row_index LIMIT $1),"
    " page AS (SELECT batch_id, row_index,"
    "  sum(bytes) OVER (ORDER BY batch_id, row_index) AS upto,"
    "  row_number() OVER (ORDER BY batch_id, row_index) AS n FROM taken)"
    " SELECT p.batch_id, p.row_index, r.request, b.model, b.params, b.expires_at"
    " FROM page p JOIN batches b ON b.id = p.batch_id"
    " JOIN batch_rows r ON r.batch_id = b.rows_batch_id AND r.row_index = p.row_index"
    " WHERE p.n = 1 OR p.upto <= $2"
    " ORDER BY p.batch_id, p.row_index"
)
