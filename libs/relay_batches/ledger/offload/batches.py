"""The provider batch's life: leased records walked through ``creating``,
``submitted``, ``canceling`` and ``ended`` by guarded transitions, polled with back-off,
and the lines of its input file read in pages."""

from __future__ import annotations

from collections.abc import Sequence

from relay_batches.ledger.offload.records import (
    BATCH_COLUMNS,
    ENDED,
    BatchState,
    OffloadBatch,
    OffloadLine,
    PoolStore,
    RowState,
    batch_of,
)
from relay_batches.ledger.pool import translated


class ProviderBatches(PoolStore):
    """The leased life of provider batch records."""

    # --- the provider batch's life -----------------------------------------------------

    async def claim(
        self, owner: str, states: Sequence[BatchState], lease_s: float, limit: int
    ) -> list[OffloadBatch]:
        """Lease up to ``limit`` records in ``states`` that are due (``next_poll_at``
        passed) and whose lease is free or expired, oldest first."""
        async with translated():
            records = await self._pool.fetch(
                _CLAIM, owner, [str(s) for s in states], lease_s, limit
            )
        return [batch_of(r) for r in records]

    async def renew(self, offload_id: int, owner: str, lease_s: float) -> bool:
        """Extend our lease on a record while a long step runs (a large upload): only
        while we hold one; False when it is no longer ours."""
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE offload_batches SET lease_until = now() + make_interval(secs => $3)"
                " WHERE id = $1 AND owner = $2 AND lease_until IS NOT NULL RETURNING id",
                offload_id,
                owner,
                lease_s,
            )
        return value is not None

    async def lines(
        self, offload_id: int, after: tuple[str, int] | None, limit: int, max_bytes: int
    ) -> list[OffloadLine]:
        """Up to ``limit`` rows of a provider batch still to send, after ``after`` (keyset
        order by ``(batch_id, row_index)``), their requests within ``max_bytes`` (the
        first one whatever its size), with their jobs' params."""
        start = after or ("", -1)
        async with translated():
            records = await self._pool.fetch(
                _LINES, offload_id, start[0], start[1], limit, max_bytes
            )
        return [OffloadLine(*r) for r in records]

    async def set_creating(self, offload_id: int, owner: str, input_file_id: str | None) -> bool:
        """``recorded`` → ``creating`` once its input file is uploaded (OpenAI: its id)."""
        return await self._move(
            offload_id,
            owner,
            [BatchState.RECORDED, BatchState.CREATING],
            BatchState.CREATING,
            "input_file_id = COALESCE($4, input_file_id)",
            input_file_id,
        )

    async def set_submitted(self, offload_id: int, owner: str, provider_id: str) -> bool:
        """The provider holds it: ``provider_id`` stored, polled from now on."""
        return await self._move(
            offload_id,
            owner,
            [BatchState.RECORDED, BatchState.CREATING],
            BatchState.SUBMITTED,
            "provider_id = $4, submitted_at = now(), next_poll_at = now(), polls = 0,"
            " lease_until = NULL",
            provider_id,
        )

    async def set_canceling(self, offload_id: int, owner: str) -> bool:
        """Every row belongs to jobs that ended: the provider was asked to cancel it."""
        return await self._move(
            offload_id,
            owner,
            [BatchState.SUBMITTED],
            BatchState.CANCELING,
            "error = COALESCE($4::text, error)",
            None,
        )

    async def set_ended(
        self,
        offload_id: int,
        owner: str,
        output: str | None,
        errors: str | None,
        error: str | None,
    ) -> bool:
        """Its results may be read: where they are, or ``error`` when it failed whole."""
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE offload_batches SET state = $3, output_file_id = $4, error_file_id = $5,"
                " error = $6, ended_at = now(), next_poll_at = now()"
                " WHERE id = $1 AND owner = $2 AND state = ANY($7::text[]) RETURNING id",
                offload_id,
                owner,
                BatchState.ENDED,
                output,
                errors,
                error,
                [s.value for s in BatchState if s is not BatchState.SETTLED],
            )
        return value is not None

    async def polled(
        self, offload_id: int, owner: str, progress: int, poll_s: float, max_s: float
    ) -> float:
        """A poll found it still running with ``progress`` requests finished: the next
        poll comes ``poll_s`` doubled per poll without progress since, at most
        ``max_s`` (back to ``poll_s`` on progress); returns that delay."""
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE offload_batches SET"
                " polls = CASE WHEN $3 > progress THEN 0 ELSE polls + 1 END,"
                " progress = GREATEST(progress, $3), lease_until = NULL,"
                " progressed_at = CASE WHEN $3 > progress THEN now() ELSE progressed_at END,"
                " next_poll_at = now() + make_interval(secs => LEAST($5::float8,"
                "  $4::float8 * power(2, CASE WHEN $3 > progress THEN 0 ELSE polls + 1 END)))"
                " WHERE id = $1 AND owner = $2"
                " RETURNING LEAST($5::float8, $4::float8 * power(2, polls))",
                offload_id,
                owner,
                progress,
                poll_s,
                max_s,
            )
        return float(value) if value is not None else poll_s

    async def attempt(self, offload_id: int, owner: str) -> bool:
        """Count a create about to be tried (``polls``), durably before the call: a
        record resumed with a count above 0 may already have its provider batch."""
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE offload_batches SET polls = polls + 1"
                " WHERE id = $1 AND owner = $2 AND state = ANY($3::text[]) RETURNING id",
                offload_id,
                owner,
                [BatchState.RECORDED, BatchState.CREATING],
            )
        return value is not None

    async def resize(self, offload_id: int, owner: str, rows: int, size: int) -> None:
        """The rows and bytes its input file really holds (rows it could not take were
        forwarded while it was built)."""
        async with translated():
            await self._pool.execute(
                "UPDATE offload_batches SET rows = GREATEST($3, 1), bytes = $4"
                " WHERE id = $1 AND owner = $2",
                offload_id,
                owner,
                rows,
                size,
            )

    async def retry_later(self, offload_id: int, owner: str, delay_s: float, error: str) -> None:
        """A step failed (the provider or the network): let the lease go and try again
        in ``delay_s``; ``error`` is kept for the operator."""
        async with translated():
            await self._pool.execute(
                "UPDATE offload_batches SET next_poll_at = now() + make_interval(secs => $3),"
                " lease_until = NULL, error = CASE WHEN state = $5 THEN error ELSE $4 END"
                " WHERE id = $1 AND owner = $2",
                offload_id,
                owner,
                delay_s,
                error[:500],
                BatchState.ENDED,
            )

    async def all_rows_ended(self, offload_id: int) -> bool:
        """Whether every row of the provider batch belongs to a job that ended."""
        async with translated():
            value = await self._pool.fetchval(_ANY_LIVE_ROW, offload_id, ENDED)
        return value is None

    async def others_hold(self, provider_id: str, offload_id: int) -> bool:
        """Whether another record holds ``provider_id`` (a found batch is someone's)."""
        async with translated():
            value = await self._pool.fetchval(
                "SELECT 1 FROM offload_batches WHERE provider_id = $1 AND id <> $2",
                provider_id,
                offload_id,
            )
        return value is not None

    async def _move(
        self,
        offload_id: int,
        owner: str,
        allowed: Sequence[BatchState],
        to: BatchState,
        set_clause: str,
        value: str | None,
    ) -> bool:
        async with translated():
            found = await self._pool.fetchval(
                f"UPDATE offload_batches SET state = $3, {set_clause}"
                " WHERE id = $1 AND owner = $2 AND state = ANY($5::text[]) RETURNING id",
                offload_id,
                owner,
                to,
                value,
                [str(s) for s in allowed],
            )
        return found is not None


# $1 owner, $2 states, $3 lease seconds, $4 limit.
_CLAIM = (
    "UPDATE offload_batches b SET owner = $1, lease_until = now() + make_interval(secs => $3)"
    " FROM (SELECT id FROM offload_batches WHERE state = ANY($2::text[])"
    "  AND next_poll_at <= now() AND (lease_until IS NULL OR lease_until < now())"
    "  ORDER BY next_poll_at, id LIMIT $4 FOR UPDATE SKIP LOCKED) c"
    f" WHERE b.id = c.id RETURNING {', '.join('b.' + c.strip() for c in BATCH_COLUMNS.split(','))}"
)

# $1 offload batch, $2/$3 after this (batch_id, row_index), $4 limit, $5 bytes: the page
# is cut by the rows' stored sizes before any request is read.
_LINES = (
    "WITH page AS (SELECT o.batch_id, o.row_index,"
    "  sum(o.bytes) OVER (ORDER BY o.batch_id, o.row_index) AS upto,"
    "  row_number() OVER (ORDER BY o.batch_id, o.row_index) AS n"
    f"  FROM offload_rows o WHERE o.provider_batch = $1 AND o.state = '{RowState.SUBMITTED}'"
    "  AND (o.batch_id, o.row_index) > ($2, $3)"
    "  ORDER BY o.batch_id, o.row_index LIMIT $4)"
    " SELECT p.batch_id, p.row_index, r.request, b.params"
    " FROM page p JOIN batches b ON b.id = p.batch_id"
    " JOIN batch_rows r ON r.batch_id = b.rows_batch_id AND r.row_index = p.row_index"
    " WHERE p.n = 1 OR p.upto <= $5"
    " ORDER BY p.batch_id, p.row_index"
)

# $1 offload batch, $2 the ended statuses: one row whose job is still live, if any.
_ANY_LIVE_ROW = (
    "SELECT 1 FROM offload_rows o JOIN batches b ON b.id = o.batch_id"
    " WHERE o.provider_batch = $1 AND NOT b.status = ANY($2::text[]) LIMIT 1"
)

# $1 limit, $2 bytes: rows to forward of running jobs (locked), cut by their stored
# sizes, then with what their slice carries. A paused or queued job's rows wait for it
# to run again; an ended job's are dropped, not forwarded. The scan goes from the
# offloaded running jobs (index batches_offloaded) to their rows to forward by key, so
