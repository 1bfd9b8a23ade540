"""Intake and gathering: an offloaded job's released rows taken into
``offload_rows`` under the batch deployment that leads each row's alias, rows of ended
jobs dropped, and a deployment's pending rows cut into a provider batch when due."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from relay_batches.ledger.offload.records import (
    ANALYZE_AFTER_ROWS,
    DROP_WITHIN_S,
    INTAKE_STEP,
    BatchState,
    Gathering,
    PoolStore,
    RowState,
    log,
)
from relay_batches.ledger.pool import translated
from relay_batches.ledger.status_sql import status_in
from relay_batches.model import TERMINAL, JobStatus


class Intake(PoolStore):
    """Intake, drops and gathering of offloaded rows."""

    # --- intake and gathering ---------------------------------------------------------

    async def intake(
        self,
        leads: Mapping[str, str],
        step: int = INTAKE_STEP,
        jobs: int = 16,
        routed: Collection[str] | None = None,
        patterns: Sequence[tuple[str, str]] = (),
    ) -> int:
        """Take up to ``step`` released rows of each of up to ``jobs`` offloaded running
        jobs (each job once a call, so a large one does not hold the others back) into
        ``offload_rows``, one transaction per job, the job locked SKIP LOCKED so replicas
        take different ones; and move up to ``step`` pending rows of deployments that are
        no longer batch deployments to ``forward``. How many rows were recorded or moved.

        ``leads`` maps each alias led by a batch deployment to that deployment (an
        alias mapped to ``""`` is led by none); a row whose own alias (else its job's)
        has no lead is recorded as ``forward``.
        ``routed`` names every batch deployment of the routes (None: no such move), as
        only those are gathered. ``patterns`` are the routes' alias patterns as
        ``(prefix, lead)`` (:meth:`~relay_batches.router.aliases.AliasTable.lead_patterns`,
        the longest prefix first, ``""`` for an alias no batch deployment leads): a row
        whose alias is none of ``leads`` takes the lead of the first prefix it starts with.
        """
        aliases, deployments = list(leads), list(leads.values())
        prefixes, prefix_leads = [p for p, _ in patterns], [d for _, d in patterns]
        recorded = 0
        if routed is not None:
            async with translated():
                status = await self._pool.execute(_FORWARD_UNROUTED, list(routed), step)
            recorded = int(status.split()[-1])
        taken: list[str] = []
        for _ in range(jobs):
            async with translated(), self._pool.acquire() as conn, conn.transaction():
                job = await conn.fetchrow(_INTAKE_LOCK, taken)
                if job is None:
                    break
                batch_id, rows_batch_id, model, start, upto = job
                taken.append(batch_id)
                end = min(upto, start + step)
                rows = (batch_id, rows_batch_id, start, end, model)
                routes = (aliases, deployments, prefixes, prefix_leads)
                status = await conn.execute(_INTAKE_ROWS, *rows, *routes)
                await conn.execute(_INTAKE_ADVANCE, batch_id, end)
                recorded += int(status.split()[-1])
        self._unanalyzed += recorded
        if self._unanalyzed >= ANALYZE_AFTER_ROWS:
            async with translated():
                await self._pool.execute("ANALYZE offload_rows")
            self._unanalyzed = 0
        return recorded

    async def drop_ended(
        self, within_s: float = DROP_WITHIN_S, step: int = INTAKE_STEP, rounds: int = 16
    ) -> int:
        """Pending and forward rows of offloaded jobs that ended (canceled, expired, …)
        within the last ``within_s`` become ``dropped``, ``step`` rows a statement (each
        its own transaction), at most ``rounds`` statements a call; how many. Only a
        marking: such rows are never gathered nor forwarded anyway (both take running
        jobs' rows only), so the scan goes from the recently ended jobs (index
        ``batches_ended``) to their rows by key, never over every waiting row."""
        dropped = 0
        for _ in range(rounds):
            async with translated():
                status = await self._pool.execute(_DROP_ENDED, within_s, step)
            moved = int(status.split()[-1])
            dropped += moved
            if moved < step:
                break
        return dropped

    async def gather(self, gathering: Gathering) -> int | None:
        """Cut one provider batch of ``gathering.deployment``'s pending rows of running
        jobs if it is due (row cap, byte budget or linger reached), after sending a
        bounded step of those whose jobs' deadlines came too near realtime: its record
        (``recorded``) and its rows' ``submitted`` mark in one transaction, under an
        advisory lock on the deployment (a replica gathering it meanwhile skips). The
        new record's id, or None when nothing was due."""
        g = gathering
        wait_s = g.window_s + g.margin_s
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval(_GATHER_LOCK, g.deployment):
                return None
            late = await conn.execute(_GATHER_LATE, g.deployment, wait_s, g.late_step)
            if late != "UPDATE 0":
                log.info(
                    "offload_too_late",
                    extra={"deployment": g.deployment, "rows": int(late.split()[-1])},
                )
            made = await conn.fetchval(
                _GATHER, g.deployment, g.max_rows, g.max_bytes, g.line_extra, g.linger_s, wait_s
            )
        return None if made is None else int(made)


# $1 jobs taken this call: one more offloaded running job with released rows not yet
# taken in; SKIP LOCKED, so a replica taking in another job at once passes this one by.
_INTAKE_LOCK = (
    "SELECT id, rows_batch_id, model, offload_upto, dispatched_upto FROM batches"
    f" WHERE offload_deployment IS NOT NULL AND {status_in([JobStatus.RUNNING])}"
    " AND offload_upto < dispatched_upto AND NOT id = ANY($1::text[])"
    " ORDER BY id LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED"
)

# $1 job, $2 its rows' batch, $3..$4 the rows, $5 the job's alias, $6/$7 alias → lead,
# $8/$9 pattern prefix → lead ('' for none), the longest prefix first: a row naming no
# alias of $6 takes its first matching prefix's lead (no lead: forward).
# A row's own alias is batch_rows.model (read from its request when it was stored: see
# ledger/row_model.py); rows naming none run under the job's, and a row whose request
# could not be read names '' (no lead: it goes realtime). Rows with an outcome are left
# out (a job offloaded after a crash of its first release may have some).
_INTAKE_ROWS = (
    "INSERT INTO offload_rows (batch_id, row_index, deployment, state, bytes)"
    " SELECT $1, r.row_index, COALESCE(l.deployment, p.deployment, ''),"
    "  CASE WHEN COALESCE(l.deployment, p.deployment, '') = ''"
    f"   THEN '{RowState.FORWARD}' ELSE '{RowState.PENDING}' END,"
    "  octet_length(r.request)"
    " FROM batch_rows r"
    " LEFT JOIN unnest($6::text[], $7::text[]) AS l(alias, deployment)"
    "  ON l.alias = COALESCE(r.model, $5)"
    " LEFT JOIN LATERAL (SELECT t.deployment"
    "  FROM unnest($8::text[], $9::text[]) WITH ORDINALITY AS t(prefix, deployment, n)"
    "  WHERE l.alias IS NULL AND left(COALESCE(r.model, $5), length(t.prefix)) = t.prefix"
    "  ORDER BY t.n LIMIT 1) p ON true"
    " WHERE r.batch_id = $2 AND r.row_index >= $3 AND r.row_index < $4"
    " AND NOT EXISTS (SELECT 1 FROM row_results o WHERE o.batch_id = $1"
    "  AND o.row_index = r.row_index AND o.row_index >= $3 AND o.row_index < $4)"
    " ON CONFLICT (batch_id, row_index) DO NOTHING"
)
# $1 the batch deployments, $2 rows at most: pending rows of any other deployment (it
# left the routes file, or runs realtime now) go realtime (dropped if their job ended).
# The deployments holding pending rows are found by a skip scan of index
# offload_rows_pending (one probe per deployment), never by reading every pending row.
_FORWARD_UNROUTED = f"""
WITH RECURSIVE held (deployment) AS (
    (SELECT deployment FROM offload_rows WHERE state = '{RowState.PENDING}'
     ORDER BY deployment LIMIT 1)
    UNION ALL
    SELECT (SELECT o.deployment FROM offload_rows o
            WHERE o.state = '{RowState.PENDING}' AND o.deployment > h.deployment
            ORDER BY o.deployment LIMIT 1)
    FROM held h WHERE h.deployment IS NOT NULL
),
gone AS (
    SELECT deployment FROM held
    WHERE deployment IS NOT NULL AND NOT deployment = ANY($1::text[])
),
k AS (
    SELECT r.batch_id, r.row_index FROM gone g CROSS JOIN LATERAL (
        SELECT r.batch_id, r.row_index FROM offload_rows r
        WHERE r.state = '{RowState.PENDING}' AND r.deployment = g.deployment
        ORDER BY r.created_at, r.batch_id, r.row_index
        LIMIT $2 FOR UPDATE SKIP LOCKED) r
    LIMIT $2
)
UPDATE offload_rows o SET state = CASE WHEN b.{status_in(TERMINAL)}
    THEN '{RowState.DROPPED}' ELSE '{RowState.FORWARD}' END
FROM k JOIN batches b ON b.id = k.batch_id
WHERE o.batch_id = k.batch_id AND o.row_index = k.row_index
"""
_INTAKE_ADVANCE = "UPDATE batches SET offload_upto = GREATEST(offload_upto, $2) WHERE id = $1"

# $1 seconds: the offloaded jobs that ended that recently, then up to $2 of their
# waiting rows (locked SKIP LOCKED: a row a gather holds is left for the next step).
_DROP_ENDED = (
    f"UPDATE offload_rows o SET state = '{RowState.DROPPED}'"
    " FROM (SELECT w.batch_id, w.row_index"
    f"  FROM (SELECT id FROM batches WHERE {status_in(TERMINAL)}"
    "   AND completed_at > now() - make_interval(secs => $1)"
    "   AND offload_deployment IS NOT NULL) b"
    "  JOIN offload_rows w ON w.batch_id = b.id"
    f"  WHERE w.state IN ('{RowState.PENDING}', '{RowState.FORWARD}')"
    "  LIMIT $2 FOR UPDATE OF w SKIP LOCKED) k"
    " WHERE o.batch_id = k.batch_id AND o.row_index = k.row_index"
)

_GATHER_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext('relay.offload.gather'), hashtext($1))"

# $1 deployment, $2 seconds a job must still have, $3 rows at most: pending rows of
# running jobs whose deadline is nearer go realtime (locked SKIP LOCKED, like gather's).
_GATHER_LATE = (
    f"UPDATE offload_rows o SET state = '{RowState.FORWARD}'"
    " FROM (SELECT o.batch_id, o.row_index FROM offload_rows o JOIN batches b ON b.id = o.batch_id"
    f"  WHERE o.deployment = $1 AND o.state = '{RowState.PENDING}'"
    f"  AND b.status = '{JobStatus.RUNNING}'"
    "  AND b.expires_at < now() + make_interval(secs => $2)"
    "  ORDER BY o.created_at, o.batch_id, o.row_index LIMIT $3 FOR UPDATE OF o SKIP LOCKED) k"
    " WHERE o.batch_id = k.batch_id AND o.row_index = k.row_index"
)

# $1 deployment, $2 row cap, $3 byte budget, $4 bytes added to each row's size, $5 the
# linger in seconds, $6 the seconds a job must still have (its deadline nearer: the
# rows wait for _GATHER_LATE). The candidates are its pending rows of running jobs whose budget has
# not stopped them (a paused job's rows wait), oldest first, at most the row cap, locked
# (a row a drop holds is passed by, one it dropped meanwhile is no longer pending); those
# whose running sum of sizes fits the budget (the first always) make the batch, which is
# due when they reach the row cap, when a candidate is left over for bytes, or when the
# oldest waited the linger. The record and the rows' mark are one statement.
_GATHER = f"""
WITH locked AS MATERIALIZED (
    SELECT o.batch_id, o.row_index, o.bytes, o.created_at
    FROM offload_rows o JOIN batches b ON b.id = o.batch_id
    WHERE o.deployment = $1 AND o.state = '{RowState.PENDING}'
      AND b.status = '{JobStatus.RUNNING}' AND b.budget_exceeded_at IS NULL
      AND (b.expires_at IS NULL OR b.expires_at >= now() + make_interval(secs => $6))
    ORDER BY o.created_at, o.batch_id, o.row_index
    LIMIT $2
    FOR UPDATE OF o SKIP LOCKED
),
cand AS MATERIALIZED (
    SELECT batch_id, row_index, bytes + $4 AS size, created_at,
           sum(bytes + $4) OVER w AS upto, row_number() OVER w AS n
    FROM locked
    WINDOW w AS (ORDER BY created_at, batch_id, row_index)
),
pick AS (SELECT batch_id, row_index, size FROM cand WHERE n = 1 OR upto <= $3),
stats AS (
    SELECT (SELECT count(*) FROM pick) AS rows, (SELECT sum(size) FROM pick) AS bytes,
           (SELECT count(*) FROM cand) > (SELECT count(*) FROM pick) AS full_bytes,
           (SELECT min(created_at) FROM cand) AS oldest
),
made AS (
    INSERT INTO offload_batches (deployment, state, rows, bytes)
    SELECT $1, '{BatchState.RECORDED}', rows, bytes FROM stats
    WHERE rows > 0 AND (rows >= $2 OR full_bytes
                        OR oldest <= now() - make_interval(secs => $5))
    RETURNING id
),
marked AS (
    UPDATE offload_rows o SET state = '{RowState.SUBMITTED}', provider_batch = made.id
    FROM made, pick WHERE o.batch_id = pick.batch_id AND o.row_index = pick.row_index
      AND o.state = '{RowState.PENDING}'
    RETURNING 1
)
SELECT id FROM made WHERE (SELECT count(*) FROM marked) > 0
"""
