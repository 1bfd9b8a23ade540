"""The dispatcher's ledger: claim jobs under a lease, record progress, find stalled jobs
(the reads of a job's rows are :mod:`.released_rows`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

import asyncpg

from relay_batches.ledger.lock_order import update_jobs_in_id_order
from relay_batches.ledger.pool import translated
from relay_batches.ledger.released_rows import ReleasedRows
from relay_batches.ledger.status_sql import status_in
from relay_batches.ledger.unfinished import no_outcome
from relay_batches.model import JobStatus, allowed_from

_JOB_COLUMNS = (
    "id, model, priority, total, completed, failed, status, dispatched_upto, rows_batch_id, params,"
    " workspace_id, expires_at, budget_exceeded_at, offload_deployment, budget_usd, cost_usd,"
    " pauses, created_at, started_at, traceparent"
)
# Whether rows a row-worker handed back (a pause) wait to be released again.
_RETURNED = (
    "EXISTS (SELECT 1 FROM returned_rows x WHERE x.batch_id = {alias}id AND NOT x.taken)"
    " AS returned"
)


@dataclass(frozen=True)
class RunningJob:
    """What a dispatcher needs to know about a job it owns."""

    id: str
    model: str
    priority: int
    total: int
    completed: int
    failed: int
    status: JobStatus
    dispatched_upto: int
    rows_batch_id: str
    params: str
    workspace_id: str = ""
    expires_at: datetime | None = None  # the end of its completion window, if any
    budget_exceeded_at: datetime | None = None  # its budget stop: no row is released after
    offload_deployment: str | None = None  # the batch deployment it was offloaded to
    budget_usd: float | None = None  # its budget, if any (such a job is never offloaded)
    cost_usd: float = 0.0  # the cost of its outcomes recorded so far
    pauses: int = 0  # how many times it was paused: its slices carry it
    created_at: datetime | None = None
    started_at: datetime | None = None  # its first claim's time (a claim sets it once)
    traceparent: str | None = None  # its trace context, if traced (relay_batches.tracing)
    returned: bool = False  # rows handed back unstarted wait to be released again

    @property
    def done(self) -> int:
        """Rows with an outcome."""
        return self.completed + self.failed

    @property
    def budget_stopped(self) -> bool:
        """Its recorded cost reached its budget: no more of its rows are released (those
        already out finish, and are re-sent if lost)."""
        return self.budget_exceeded_at is not None


@dataclass(frozen=True)
class StalledJob:
    """A job that made no progress for the stall timeout; ``first_unfinished`` is None
    when every row has an outcome (the job is about to finish)."""

    id: str
    first_unfinished: int | None


class DispatchStore(ReleasedRows):
    """Leases and claims for the dispatcher, with the row reads of :class:`ReleasedRows`."""

    async def claim_queued(
        self,
        owner: str,
        limit: int,
        lease_s: float,
        per_workspace: int = 0,
        floors: dict[str, int] | None = None,
    ) -> list[RunningJob]:
        """Mark up to ``limit`` queued jobs running under our lease, shared fairly.

        Workspaces take turns: a workspace's next job ranks by how many jobs it already
        runs plus its place among its own queued jobs (``priority DESC, created_at``), so
        each claim goes to the workspaces running least; ties go to the longest waiting.
        ``per_workspace`` > 0 caps the running jobs of one workspace (an offloaded job
        whose lease went back is not counted: the offloader runs it). The workspaces are
        locked ``SKIP LOCKED`` for the statement, so dispatchers claiming at once split
        them and each counts exactly. A queued job below its workspace's entry in
        ``floors`` (the highest priority we release rows for there) is left queued: it
        would only park, taking room and no slot.
        """
        spaces = dict(floors or {})
        async with translated():
            records = await self._pool.fetch(
                _CLAIM_QUEUED,
                owner,
                limit,
                lease_s,
                JobStatus.RUNNING,
                per_workspace,
                list(spaces),
                list(spaces.values()),
            )
        return sorted((_running(r) for r in records), key=lambda j: -j.priority)

    async def claim_outranking(
        self,
        owner: str,
        floors: dict[str, int],
        limit: int,
        lease_s: float,
        per_workspace: int = 0,
    ) -> list[RunningJob]:
        """Claim up to ``limit`` queued jobs that outrank every job we run of their workspace.

        ``floors`` maps a workspace to the highest priority we run for it; a queued job of
        that workspace above it is claimed even though our slots are full (the lower jobs
        then park, see the dispatcher). The workspaces take turns as in
        :meth:`claim_queued` (their running jobs, parked ones included, plus the job's
        rank among its workspace's outranking jobs), and ``per_workspace`` > 0 caps a
        workspace's running jobs here too.
        """
        if not floors or limit <= 0:
            return []
        async with translated():
            records = await self._pool.fetch(
                _CLAIM_OUTRANKING,
                owner,
                limit,
                lease_s,
                JobStatus.RUNNING,
                list(floors),
                list(floors.values()),
                per_workspace,
            )
        return sorted((_running(r) for r in records), key=lambda j: -j.priority)

    async def claim_expired(self, owner: str, limit: int, lease_s: float) -> list[RunningJob]:
        """Take over running jobs whose owner's lease expired (or that have no owner)."""
        async with translated():
            records = await self._pool.fetch(_CLAIM_EXPIRED, owner, limit, lease_s)
        return sorted((_running(r) for r in records), key=lambda j: -j.priority)

    async def renew(self, owner: str, job_ids: list[str], lease_s: float) -> list[RunningJob]:
        """Extend our lease on ``job_ids``; return those still running and ours."""
        async with translated():
            records = await self._pool.fetch(
                _RENEW,
                owner,
                job_ids,
                lease_s,
                JobStatus.RUNNING,
            )
        return [_running(r) for r in records]

    async def release(self, owner: str, job_ids: list[str]) -> None:
        """Give up our lease on ``job_ids`` so another dispatcher can take them at once."""
        async with translated():
            await self._pool.execute(
                _RELEASE,
                owner,
                job_ids,
            )

    async def claim_stalled(
        self,
        owner: str,
        job_ids: list[str],
        stall_s: float,
        settled: Mapping[str, int] | None = None,
    ) -> list[StalledJob]:
        """Our running jobs without progress for ``stall_s``, each with its first unfinished row.

        Claiming restarts the job's stall clock (``last_progress_at = now()``), so a job
        is re-published at most once per stall period, by its owner only. ``settled``
        maps a job to a row below which every row is known to have an outcome: the walk
        to its first unfinished row starts there (else at row 0).
        """
        below = dict(settled or {})
        async with translated():
            records = await self._pool.fetch(
                _CLAIM_STALLED,
                owner,
                job_ids,
                stall_s,
                JobStatus.RUNNING,
                list(below),
                list(below.values()),
            )
        return [StalledJob(r[0], r[1]) for r in records]

    async def recording_silences(self) -> dict[str, float]:
        """Per running job with an outcome recorded, the seconds (on the ledger's clock)
        since the aggregator last recorded one of its outcomes. One read over the
        running jobs (partial index ``batches_running``)."""
        async with translated():
            records = await self._pool.fetch(_RECORDING_SILENCES)
        return {r[0]: float(r[1]) for r in records}

    async def advance(self, owner: str, job_id: str, upto: int) -> bool:
        """Record that rows below ``upto`` are released, before they are published (so a
        row is never out while the ledger holds it unreleased); False, and nothing may
        be published, if the job is no longer ours and running or its budget stopped it.

        A row below ``dispatched_upto`` that never went out (a crash or a failed publish
        right after this) has no outcome and nobody holds it: stall recovery re-sends it.
        """
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE batches SET dispatched_upto = GREATEST(dispatched_upto, $3)"
                " WHERE id = $2 AND lease_owner = $1 AND status = $4"
                " AND budget_exceeded_at IS NULL RETURNING id",
                owner,
                job_id,
                upto,
                JobStatus.RUNNING,
            )
        return value is not None

    async def offload(self, owner: str, job_id: str, total: int, deployment: str) -> bool:
        """Mark a job we own offloaded to ``deployment`` and release all its rows, in one
        statement: only while it is running, ours, not yet marked and not yet released
        at all (a job that began realtime stays realtime). A job with a budget may be
        offloaded when its plan's cost fits the budget (the lane plan decides). False,
        and nothing changed, otherwise."""
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE batches SET dispatched_upto = $3, offload_deployment = $4"
                " WHERE id = $2 AND lease_owner = $1 AND status = $5"
                " AND offload_deployment IS NULL"
                " AND dispatched_upto = 0 RETURNING id",
                owner,
                job_id,
                total,
                deployment,
                JobStatus.RUNNING,
            )
        return value is not None

    async def fail(self, job_id: str, error: str) -> bool:
        """Guarded transition of a queued or running job to ``failed`` with ``error``."""
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE batches SET status = $3, error = $2, completed_at = now(),"
                " lease_owner = NULL WHERE id = $1 AND status = ANY($4::text[]) RETURNING id",
                job_id,
                error,
                JobStatus.FAILED,
                allowed_from(JobStatus.FAILED),
            )
        return value is not None


def _prefixed(alias: str) -> str:
    columns = ", ".join(f"{alias}.{c.strip()}" for c in _JOB_COLUMNS.split(","))
    return f"{columns}, {_RETURNED.format(alias=alias + '.')}"


def _running(record: asyncpg.Record) -> RunningJob:
    """A :class:`RunningJob` from a ``_JOB_COLUMNS`` record, its status typed."""
    job = RunningJob(*record)
    return replace(job, status=JobStatus(job.status))


_QUEUED = status_in(allowed_from(JobStatus.RUNNING))
# A job past its deadline is never claimed, reaped or not (the reaper may not have run).
_LIVE = "(expires_at IS NULL OR expires_at > now())"
_LIVE_Q = "(q.expires_at IS NULL OR q.expires_at > now())"
_RUNNING = status_in([JobStatus.RUNNING])
# A running job that holds one of its workspace's running places: an offloaded job whose
# lease went back (the offloader runs it, for up to the provider's window) holds none,
# so the workspace's realtime jobs do not wait behind it.
_HOLDS_PLACE = "(offload_deployment IS NULL OR lease_expires_at > now())"
# A job whose budget stopped it releases no more rows (``advance`` refuses it); it is
# claimed only while rows it released before are in flight, so stall recovery still
# re-sends those if lost. With none in flight (every row below ``dispatched_upto`` has an
# outcome, and no row above has one) the aggregator's budget settle ends it.
_WANTED = "(budget_exceeded_at IS NULL OR dispatched_upto > completed + failed)"
_WANTED_Q = "(q.budget_exceeded_at IS NULL OR q.dispatched_upto > q.completed + q.failed)"

# $1 owner, $2 limit, $3 lease seconds, $4 running, $5 per-workspace cap (0: none): the
# guarded move of the queued jobs whose turn comes first. ``turn`` is the workspace's
# running jobs plus the job's rank among its workspace's queued ones, so claims go round
# the workspaces; on a tie the workspace served least recently (``last_claim_at``) goes
# first, and each claim stamps the workspaces it served. The scans name their statuses so
# they use the partial indexes; FOR UPDATE cannot sit beside a window function, so the
# picked ids are locked after. A resumed job (paused, then queued again) keeps the
# ``started_at`` of its first claim.
_CLAIM_QUEUED = (
    "WITH spaces AS ("
    "  SELECT w.id, w.last_claim_at FROM workspaces w"
    f"  WHERE w.id IN (SELECT workspace_id FROM batches WHERE {_QUEUED})"
    "  FOR NO KEY UPDATE SKIP LOCKED),"
    " load AS ("
    "  SELECT workspace_id, count(*) AS running FROM batches"
    f"  WHERE {_RUNNING} AND {_HOLDS_PLACE} AND workspace_id IN (SELECT id FROM spaces)"
    "  GROUP BY workspace_id),"
    " turns AS ("
    "  SELECT q.id, q.created_at, s.last_claim_at,"
    "   COALESCE(l.running, 0) + row_number() OVER ("
    "    PARTITION BY q.workspace_id ORDER BY q.priority DESC, q.created_at, q.id) AS turn"
    "  FROM batches q JOIN spaces s ON s.id = q.workspace_id"
    "  LEFT JOIN load l ON l.workspace_id = q.workspace_id"
    f"  WHERE q.{_QUEUED} AND {_LIVE_Q} AND {_WANTED_Q}"
    "   AND NOT EXISTS (SELECT 1 FROM unnest($6::text[], $7::int[]) AS f(workspace_id, floor)"
    "    WHERE f.workspace_id = q.workspace_id AND q.priority < f.floor)),"
    " picked AS ("
    "  SELECT id FROM turns WHERE $5 = 0 OR turn <= $5"
    "  ORDER BY turn, last_claim_at NULLS FIRST, created_at, id LIMIT $2),"
    " claimed AS ("
    "  UPDATE batches b SET status = $4, started_at = COALESCE(b.started_at, now()),"
    "  last_progress_at = now(), lease_owner = $1,"
    "  lease_expires_at = now() + make_interval(secs => $3)"
    "  FROM (SELECT id FROM batches WHERE id IN (SELECT id FROM picked)"
    f"        AND {_QUEUED} AND {_LIVE} AND {_WANTED} FOR UPDATE SKIP LOCKED) q"
    f"  WHERE b.id = q.id RETURNING {_prefixed('b')}),"
    " served AS ("
    "  UPDATE workspaces SET last_claim_at = now()"
    "  WHERE id IN (SELECT workspace_id FROM claimed))"
    f" SELECT {_JOB_COLUMNS}, returned FROM claimed"
)

# $1 owner, $2 limit, $3 lease seconds, $4 running, $5/$6 workspaces and the highest
# priority we run for each, $7 per-workspace cap (0: none): queued jobs above that
# priority, in the workspaces' turn (running jobs, parked ones included, plus the job's
# rank among its workspace's outranking ones) as in _CLAIM_QUEUED, best priority first;
# the workspaces are locked SKIP LOCKED for the statement, so the cap counts exactly.
_CLAIM_OUTRANKING = (
    "WITH floors AS (SELECT f.* FROM unnest($5::text[], $6::int[]) AS f(workspace_id, floor)"
    "  JOIN (SELECT w.id FROM workspaces w WHERE w.id = ANY($5::text[])"
    "   FOR NO KEY UPDATE SKIP LOCKED) s ON s.id = f.workspace_id),"
    " load AS ("
    "  SELECT workspace_id, count(*) AS running FROM batches"
    f"  WHERE {_RUNNING} AND {_HOLDS_PLACE} AND workspace_id IN (SELECT workspace_id FROM floors)"
    "  GROUP BY workspace_id),"
    " turns AS ("
    "  SELECT q.id, q.priority, q.created_at,"
    "   COALESCE(l.running, 0) + row_number() OVER ("
    "    PARTITION BY q.workspace_id ORDER BY q.priority DESC, q.created_at, q.id) AS turn"
    "  FROM batches q JOIN floors f ON f.workspace_id = q.workspace_id"
    "  LEFT JOIN load l ON l.workspace_id = q.workspace_id"
    f"  WHERE q.{_QUEUED} AND {_LIVE_Q} AND {_WANTED_Q} AND q.priority > f.floor),"
    " picked AS ("
    "  SELECT id FROM turns WHERE $7 = 0 OR turn <= $7"
    "  ORDER BY turn, priority DESC, created_at, id LIMIT $2)"
    " UPDATE batches b SET status = $4, started_at = COALESCE(b.started_at, now()),"
    " last_progress_at = now(), lease_owner = $1,"
    " lease_expires_at = now() + make_interval(secs => $3)"
    " FROM (SELECT id FROM batches WHERE id IN (SELECT id FROM picked)"
    f"       AND {_QUEUED} AND {_LIVE} AND {_WANTED} FOR UPDATE SKIP LOCKED) c"
    f" WHERE b.id = c.id RETURNING {_prefixed('b')}"
)

# $1 owner, $2 limit, $3 lease seconds: running jobs whose lease expired (batches_running).
# An offloaded job is left alone: every row of it is released and the offloader owns them.
_CLAIM_EXPIRED = (
    "UPDATE batches b SET lease_owner = $1,"
    " lease_expires_at = now() + make_interval(secs => $3)"
    f" FROM (SELECT id FROM batches WHERE {status_in([JobStatus.RUNNING])}"
    "       AND (lease_expires_at IS NULL OR lease_expires_at < now())"
    f"       AND {_WANTED} AND offload_deployment IS NULL"
    "       ORDER BY priority DESC, created_at LIMIT $2 FOR UPDATE SKIP LOCKED) q"
    f" WHERE b.id = q.id RETURNING {_prefixed('b')}"
)

# --- statements that lock several jobs: in id order (see lock_order) -----------------

# $1 owner, $2 job ids, $3 lease seconds, $4 running.
_RENEW = update_jobs_in_id_order(
    "id = ANY($2::text[]) AND lease_owner = $1 AND status = $4",
    "lease_expires_at = now() + make_interval(secs => $3)",
    _prefixed("b"),
)

# $1 owner, $2 job ids.
_RELEASE = update_jobs_in_id_order(
    "id = ANY($2::text[]) AND lease_owner = $1", "lease_expires_at = NULL"
)

# $1 owner, $2 job ids, $3 stall seconds, $4 running, $5/$6 jobs and a row below which
# each has every outcome: restarts the stall clock of our jobs without progress and
# returns each one's first row without an outcome, a walk up the job's rows from there
# that probes each row's outcome and stops at the first without (an anti-join over the
# whole job was planned as a nested loop over its outcomes where the statistics knew
# nothing of them: minutes at a million rows, the job's row locked meanwhile).
_CLAIM_STALLED = update_jobs_in_id_order(
    "id = ANY($2::text[]) AND lease_owner = $1 AND status = $4"
    " AND COALESCE(last_progress_at, started_at, created_at)"
    " < now() - make_interval(secs => $3)",
    "last_progress_at = now()",
    "b.id, (SELECT r.row_index FROM batch_rows r WHERE r.batch_id = b.rows_batch_id"
    " AND r.row_index >= COALESCE((SELECT s.below FROM unnest($5::text[], $6::int[])"
    "  AS s (id, below) WHERE s.id = b.id), 0)"
    f" AND {no_outcome('b.id', 'r.row_index')} ORDER BY r.row_index LIMIT 1)",
)

# --- reads of stall recovery ----------------------------------------------------------

# Only the aggregator's recording sets recorded_at (last_progress_at is the stall clock,
# which claims restart).
_RECORDING_SILENCES = (
    "SELECT id, extract(epoch FROM now() - recorded_at) FROM batches"
    f" WHERE {status_in([JobStatus.RUNNING])} AND recorded_at IS NOT NULL"
)
