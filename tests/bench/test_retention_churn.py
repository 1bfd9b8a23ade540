"""Benchmark of the ledger's size under retention churn: batched deletes keep it flat.

Each round stores ``JOBS`` jobs of ``ROWS`` rows (a ~1 KiB prompt each), records a
~1 KiB outcome per row, ends them, dates them past the retention and purges them with
the retention reaper's store; then a plain ``VACUUM`` (what autovacuum runs: it frees
the dead tuples' space for reuse, never returns it to the OS). ``pg_total_relation_size``
of ``batch_rows`` and ``row_results`` is read with one round's data live, after the
first round (``ledger_bytes_before_churn``) and after the last
(``ledger_bytes_after_churn``): with deletes that only leave reusable space behind, the
second stays near the first instead of growing by a round's worth each round. The same
churn without the ``VACUUM`` (autovacuum alone, at its default thresholds) is reported
beside it (``ledger_bytes_after_churn_without_vacuum``).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import asyncpg

from relay_batches.ids import new_id
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.ledger.pool import create_pool
from relay_batches.ledger.retention import RetentionStore
from relay_batches.messages import RowOutcome
from tests.bench.harness import MIB
from tests.helpers.support import create_isolation, drop_isolation

ROUNDS = 6
JOBS = 10
ROWS = 1000
PROMPT = '[{"role":"user","content":"' + "p" * 1000 + '"}]'
ANSWER = "a" * 1000
SIZE = "SELECT pg_total_relation_size('batch_rows') + pg_total_relation_size('row_results')"


async def _round(pool: asyncpg.Pool, workspace: str) -> None:
    """Store, run and end ``JOBS`` jobs, all dated a day back."""
    ids = []
    for _ in range(JOBS):
        job = await JobStore(pool).create(
            NewJob(new_id(), workspace, "churn", "gpt-4o-mini", 0, ROWS, None, None, None),
            ((f"c-{i}", PROMPT) for i in range(ROWS)),
        )
        await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", job.id)
        for start in range(0, ROWS, 250):
            await OutcomeStore(pool).record(
                [RowOutcome(job.id, i, ANSWER, None, 1) for i in range(start, start + 250)]
            )
        ids.append(job.id)
    ended = await pool.execute(
        "UPDATE batches SET completed_at = now() - interval '1 day'"
        " WHERE id = ANY($1::text[]) AND status = 'completed'",
        ids,
    )
    assert ended == f"UPDATE {JOBS}"


async def _purge(store: RetentionStore) -> int:
    purged = 0
    while (done := await store.purge_jobs()).jobs:
        purged += done.jobs
    return purged


async def _churn(*, vacuum: bool) -> tuple[list[int], float]:
    """The size after each round's insert, and the seconds spent purging."""
    iso = await create_isolation("churn")
    pool = await create_pool(iso.database_url, max_size=2)
    try:
        workspace = await KeyStore(pool).ensure_workspace("churn")
        store = RetentionStore(pool, timedelta(hours=1))
        sizes, purge_s = [], 0.0
        for _ in range(ROUNDS):
            await _round(pool, workspace)
            sizes.append(int(await pool.fetchval(SIZE)))
            started = time.monotonic()
            assert await _purge(store) == JOBS
            purge_s += time.monotonic() - started
            if vacuum:
                await pool.execute("VACUUM batch_rows, row_results")
        left = await pool.fetchval("SELECT count(*) FROM batch_rows")
    finally:
        await pool.close()
        await drop_isolation(iso)
    assert left == 0
    return sizes, purge_s


async def test_ledger_bytes_stay_flat_under_churn(report: dict[str, Any]) -> None:
    sizes, purge_s = await _churn(vacuum=True)
    unvacuumed, _ = await _churn(vacuum=False)
    report["ledger_bytes_before_churn"] = sizes[0]
    report["ledger_bytes_after_churn"] = sizes[-1]
    report["ledger_bytes_after_churn_without_vacuum"] = unvacuumed[-1]
    report["ledger_churn_rows_purged_per_s"] = round(ROUNDS * JOBS * ROWS / purge_s)
    print(
        f"\nledger bytes with one round live: first {sizes[0] / MIB:.1f} MiB,"
        f" after {ROUNDS} rounds {sizes[-1] / MIB:.1f} MiB"
        f" (each round: {[round(s / MIB, 1) for s in sizes]} MiB);"
        f" purge {ROUNDS * JOBS * ROWS / purge_s:.0f} rows/s; without VACUUM (autovacuum"
        f" only) {[round(s / MIB, 1) for s in unvacuumed]} MiB"
    )
    assert sizes[-1] < sizes[0] * 1.5, sizes
