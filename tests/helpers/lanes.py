"""What the ledger recorded of a job's lanes (the e2e and bench tests of lanes read it)."""

from __future__ import annotations

from typing import Any

import asyncpg

# sim-lanes' realtime price (tests/helpers/processes.lanes_routes), USD per million tokens.
REALTIME_PRICE = (1000.0, 2000.0)


async def lanes_of(database_url: str, batch_id: str) -> dict[str, Any]:
    """What the ledger recorded of a job's lanes: rows per lane (from each row's lane),
    its cost per lane, its late answers and plan."""
    conn = await asyncpg.connect(database_url)
    try:
        per_row = await conn.fetch(
            "SELECT lane, count(*) FROM row_results WHERE batch_id = $1 GROUP BY lane", batch_id
        )
        job = await conn.fetchrow(
            "SELECT cost_usd, cost_batch_usd, cost_flex_usd, cost_realtime_usd, rows_batch,"
            " rows_flex, rows_realtime, late_answers, lane_plan::text, prompt_tokens,"
            " completion_tokens, expires_at, completed_at FROM batches WHERE id = $1",
            batch_id,
        )
        moved = await conn.fetch(
            "SELECT DISTINCT s.moved_reason FROM offload_batches s JOIN offload_rows o"
            " ON o.provider_batch = s.id WHERE o.batch_id = $1",
            batch_id,
        )
    finally:
        await conn.close()
    assert job is not None
    return {"rows": {r[0]: r[1] for r in per_row}, "job": dict(job), "moved": {r[0] for r in moved}}


def realtime_cost(job: dict[str, Any]) -> float:
    """What the job's tokens would have cost all realtime."""
    prompt, completion = REALTIME_PRICE
    return (job["prompt_tokens"] * prompt + job["completion_tokens"] * completion) / 1e6
