"""A job's progress over time and its per-row latency, summed up in the ledger.

One aggregate statement over the job's ``row_results`` gives everything the stats
endpoint (and the panel's charts) show: rows recorded per interval from the first
outcome to the last (empty intervals as zeros), and a fixed latency histogram with its
percentiles. The output is bounded whatever the job's size: at most
:data:`MAX_INTERVALS` intervals and ``len(LATENCY_BOUNDS_MS) + 1`` buckets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from relay_batches.errors import TransientError
from relay_batches.ledger.pool import translated
from relay_batches.model import Job, iso

# The interval widths to choose from, smallest first; the one chosen is the smallest that
# keeps the progress series to MAX_INTERVALS intervals (a job longer than 119 days gets a
# whole number of days). Every width divides a day, so intervals start on round times.
INTERVALS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
MAX_INTERVALS = 120
DAY_S = 86400
# The histogram's upper bounds (a latency falls in the first bucket it is ≤), then +inf.
LATENCY_BOUNDS_MS = (10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
PERCENTILES = (0.5, 0.9, 0.99)


def interval_for(first_s: float, last_s: float) -> int:
    """The width of the progress intervals for outcomes recorded from ``first_s`` to
    ``last_s`` (Unix seconds): the smallest of :data:`INTERVALS_S` whose intervals,
    aligned on the Unix epoch, number at most :data:`MAX_INTERVALS` over that span.

    The statement below makes the same choice in SQL (an integration test holds them
    together); this is the rule, written out."""
    for width in INTERVALS_S:
        if math.floor(last_s / width) - math.floor(first_s / width) < MAX_INTERVALS:
            return width
    return DAY_S * (math.floor((last_s - first_s) / (DAY_S * (MAX_INTERVALS - 1))) + 1)


# $1 the job's id, $2 INTERVALS_S, $3 MAX_INTERVALS, $4 LATENCY_BOUNDS_MS, $5 PERCENTILES.
# ``span`` reads the job's outcomes once for their extent and latency figures; ``pick``
# chooses the width (interval_for's rule); ``bins`` counts the outcomes per interval
# (date_bin on the epoch) and ``buckets`` per latency bucket (width_bucket over the
# bounds, shifted by one so that a latency equal to a bound falls in that bound's
# bucket), and of those the failed ones. The series and the histogram are filled with
# zeros where nothing fell.
_STATS = """
WITH o AS (
  SELECT created_at, error IS NULL AS ok, latency_ms FROM row_results WHERE batch_id = $1
), span AS (
  SELECT min(created_at) AS first_at, max(created_at) AS last_at,
    count(latency_ms) AS latency_count, max(latency_ms) AS max_ms,
    percentile_disc($5::float8[]) WITHIN GROUP (ORDER BY latency_ms) AS pct
  FROM o
), pick AS (
  SELECT s.*, COALESCE(
      (SELECT min(w) FROM unnest($2::int[]) w
        WHERE floor(extract(epoch FROM s.last_at) / w)
              - floor(extract(epoch FROM s.first_at) / w) < $3),
      86400 * (floor(extract(epoch FROM s.last_at - s.first_at) / (86400 * ($3 - 1))) + 1)
    )::int AS interval_s
  FROM span s
), bins AS (
  SELECT date_bin(make_interval(secs => p.interval_s), o.created_at, 'epoch') AS start,
    count(*) FILTER (WHERE o.ok) AS completed, count(*) FILTER (WHERE NOT o.ok) AS failed
  FROM o, pick p GROUP BY 1
), buckets AS (
  SELECT width_bucket(latency_ms - 1, $4::int[]) AS bucket, count(*) AS n,
    count(*) FILTER (WHERE NOT ok) AS failed
  FROM o WHERE latency_ms IS NOT NULL GROUP BY 1
)
SELECT p.interval_s, p.latency_count, p.max_ms, p.pct,
  ARRAY(
    SELECT ROW(g.start, COALESCE(b.completed, 0), COALESCE(b.failed, 0))
    FROM generate_series(
        date_bin(make_interval(secs => p.interval_s), p.first_at, 'epoch'),
        p.last_at, make_interval(secs => p.interval_s)) AS g(start)
    LEFT JOIN bins b ON b.start = g.start ORDER BY g.start
  ) AS progress,
  ARRAY(
    SELECT COALESCE(k.n, 0)
    FROM generate_series(0, cardinality($4::int[])) AS i(bucket)
    LEFT JOIN buckets k ON k.bucket = i.bucket ORDER BY i.bucket
  ) AS bucket_counts,
  ARRAY(
    SELECT COALESCE(k.failed, 0)
    FROM generate_series(0, cardinality($4::int[])) AS i(bucket)
    LEFT JOIN buckets k ON k.bucket = i.bucket ORDER BY i.bucket
  ) AS bucket_failed
FROM pick p
"""


@dataclass(frozen=True)
class Interval:
    """Rows recorded from ``start`` for one interval: succeeded and failed."""

    start: datetime
    completed: int
    failed: int


@dataclass(frozen=True)
class JobStats:
    """A job's progress series and latency histogram (see the module's docstring)."""

    job: Job
    interval_s: int
    progress: tuple[Interval, ...]
    latency_count: int
    percentiles_ms: tuple[int | None, ...]
    max_ms: int | None
    bucket_counts: tuple[int, ...]
    bucket_failed: tuple[int, ...]

    def to_api(self) -> dict[str, Any]:
        """The ``batch.stats`` object of ``GET /v1/batches/{id}/stats``."""
        p50, p90, p99 = self.percentiles_ms
        bounds: tuple[int | None, ...] = (*LATENCY_BOUNDS_MS, None)
        return {
            "id": self.job.id,
            "object": "batch.stats",
            "status": self.job.status,
            "started_at": iso(self.job.started_at),
            "interval_s": self.interval_s,
            "progress": [
                {"start": iso(i.start), "completed": i.completed, "failed": i.failed}
                for i in self.progress
            ],
            "latency": {
                "count": self.latency_count,
                "p50_ms": p50,
                "p90_ms": p90,
                "p99_ms": p99,
                "max_ms": self.max_ms,
                "buckets": [
                    {"le_ms": le, "count": n, "failed": failed}
                    for le, n, failed in zip(
                        bounds, self.bucket_counts, self.bucket_failed, strict=True
                    )
                ],
            },
        }


class JobStatsStore:
    """The stats query of the public API."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def stats(self, job: Job) -> JobStats:
        """``job``'s progress per interval and latency histogram, in one statement."""
        async with translated():
            record = await self._pool.fetchrow(
                _STATS, job.id, INTERVALS_S, MAX_INTERVALS, LATENCY_BOUNDS_MS, PERCENTILES
            )
        if record is None:  # never: an aggregate without GROUP BY answers one row
            raise TransientError(f"no stats row for {job.id}")
        pct = record["pct"] or (None,) * len(PERCENTILES)
        return JobStats(
            job=job,
            interval_s=record["interval_s"] or INTERVALS_S[0],  # None: no outcome yet
            progress=tuple(Interval(*row) for row in record["progress"]),
            latency_count=record["latency_count"],
            percentiles_ms=tuple(pct),
            max_ms=record["max_ms"],
            bucket_counts=tuple(record["bucket_counts"]),
            bucket_failed=tuple(record["bucket_failed"]),
        )
