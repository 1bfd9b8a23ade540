"""A workspace's usage: rows, tokens and cost per day and per model, from the ledger.

One aggregate over the workspace's jobs created in a range of whole UTC days (each job's
counters: rows finished, tokens, cost), read through ``batches_workspace_list``
(``workspace_id, created_at``): a range scan of the workspace's jobs, one row per job,
never its rows. A job counts on the day it was created, under its job-level model; a cron
template (it runs nothing itself) does not count, its runs do. The range is bounded by
the caller (at most :data:`MAX_DAYS` days).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import asyncpg

from relay_batches.ledger.pool import translated
from relay_batches.model import shown

MAX_DAYS = 92  # a quarter: the longest range one request sums up

# $1 workspace, $2 first instant, $3 end (exclusive).
_USAGE = """
SELECT (created_at AT TIME ZONE 'UTC')::date AS day, model, count(*) AS jobs,
  sum(completed + failed)::bigint AS rows, sum(failed)::bigint AS failed,
  sum(prompt_tokens)::bigint AS prompt_tokens,
  sum(completion_tokens)::bigint AS completion_tokens, sum(cost_usd) AS cost_usd
FROM batches
WHERE workspace_id = $1 AND created_at >= $2 AND created_at < $3 AND cron IS NULL
GROUP BY 1, 2
ORDER BY 1, 2
"""


# $1 workspace, $2 model: the completion tokens per answered row of the workspace's
# latest jobs of that model (a range scan of batches_workspace_list, newest first).
_MEAN_COMPLETION = """
SELECT sum(completion_tokens)::float8 / NULLIF(sum(completed), 0)
FROM (SELECT completion_tokens, completed FROM batches
      WHERE workspace_id = $1 AND model = $2 AND completed > 0 AND cron IS NULL
      ORDER BY created_at DESC LIMIT $3) recent
"""
RECENT_JOBS = 20  # the jobs the observed mean completion is taken over


@dataclass(frozen=True)
class UsageLine:
    """One day and model's sums."""

    day: date
    model: str
    jobs: int
    rows: int
    failed: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float

    def to_api(self) -> dict[str, Any]:
        """One element of ``data`` of ``GET /v1/usage``."""
        return {
            "day": self.day.isoformat(),
            "model": self.model,
            "jobs": self.jobs,
            "rows": self.rows,
            "failed": self.failed,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": shown(self.cost_usd),
        }


class UsageStore:
    """The usage query of the public API."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def usage(self, workspace_id: str, first: date, last: date) -> list[UsageLine]:
        """The sums per day and model of the jobs created from ``first`` to ``last``
        (whole UTC days, both included)."""
        start = datetime.combine(first, time(), UTC)
        end = datetime.combine(last + timedelta(days=1), time(), UTC)
        async with translated():
            records = await self._pool.fetch(_USAGE, workspace_id, start, end)
        return [UsageLine(*r) for r in records]

    async def mean_completion(self, workspace_id: str, model: str) -> float | None:
        """The workspace's observed completion tokens per answered row of ``model``
        over its latest :data:`RECENT_JOBS` jobs with answers (None: none yet)."""
        async with translated():
            value = await self._pool.fetchval(_MEAN_COMPLETION, workspace_id, model, RECENT_JOBS)
        return None if value is None else float(value)

    async def stored_requests(
        self, rows_batch_id: str, after: int, limit: int
    ) -> list[tuple[int, str]]:
        """A keyset page of the stored requests of ``rows_batch_id`` (an uploaded file's
        rows) after row ``after``, in row order."""
        async with translated():
            records = await self._pool.fetch(
                "SELECT row_index, request FROM batch_rows WHERE batch_id = $1"
                " AND row_index > $2 ORDER BY row_index LIMIT $3",
                rows_batch_id,
                after,
                limit,
            )
        return [(r[0], r[1]) for r in records]
