"""The fast lanes' measured throughput (rows a second answered in flex and realtime) of
an alias, from its recent jobs that ran in the fast lanes from the start: each job's
answered rows per lane over its run so far (``started_at`` to its last recorded
outcome), the best of them. Read by the lane plan and the ramp
(:mod:`relay_batches.lanes`); a job with fewer than :data:`MIN_ROWS` rows in a lane
says nothing of it.

Two index scans (running jobs; jobs that ended within :data:`RECENT_S`), never a scan
of the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from relay_batches.ledger.pool import translated
from relay_batches.ledger.status_sql import status_in
from relay_batches.model import TERMINAL, JobStatus

MIN_ROWS = 50
RECENT_S = 3600.0

_RATES = f"""
WITH recent AS (
    SELECT rows_flex, rows_realtime,
           GREATEST(extract(epoch FROM recorded_at - started_at), 1.0) AS elapsed
    FROM batches WHERE {status_in([JobStatus.RUNNING])} AND model = ANY($1::text[])
        AND offload_deployment IS NULL AND recorded_at IS NOT NULL
    UNION ALL
    SELECT rows_flex, rows_realtime,
           GREATEST(extract(epoch FROM recorded_at - started_at), 1.0)
    FROM batches WHERE {status_in(list(TERMINAL))}
        AND completed_at > now() - make_interval(secs => $2)
        AND model = ANY($1::text[]) AND offload_deployment IS NULL
        AND recorded_at IS NOT NULL AND started_at IS NOT NULL
)
SELECT max(rows_flex / elapsed) FILTER (WHERE rows_flex >= $3),
       max(rows_realtime / elapsed) FILTER (WHERE rows_realtime >= $3)
FROM recent
"""


async def measured_rates(pool: asyncpg.Pool, models: Sequence[str]) -> dict[str, float]:
    """The measured rows a second of the ``flex`` and ``realtime`` lanes of the jobs
    naming ``models`` (an alias and the names its patterns matched); a lane without a
    measure is left out."""
    async with translated():
        record = await pool.fetchrow(_RATES, list(models), RECENT_S, MIN_ROWS)
    if record is None:
        return {}
    found = {"flex": record[0], "realtime": record[1]}
    return {lane: float(rate) for lane, rate in found.items() if rate is not None}
