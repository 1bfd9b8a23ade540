"""The timeline and usage reads of the ledger (ledger/timeline.py, ledger/usage.py) on the
real Postgres: a job's dated events from its timestamps, its status log (migration 0031's
trigger) and its webhook attempts; a workspace's sums per day and model."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import asyncpg
import pytest

from relay_batches.errors import ApiError
from relay_batches.ids import new_id
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.timeline import TimelineStore
from relay_batches.ledger.usage import _USAGE as USAGE_SQL
from relay_batches.ledger.usage import UsageStore
from relay_batches.model import Job
from relay_batches.services.ingest_api.surfaces.native.activity import usage_range

T0 = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)


async def new_job(pool: asyncpg.Pool, workspace: str, model: str = "gpt-4o-mini") -> Job:
    """A queued job of two rows."""
    return await JobStore(pool).create(
        NewJob(new_id(), workspace, "queued", model, 0, 2, None, None, None),
        ((f"c-{i}", '[{"role":"user","content":"x"}]') for i in range(2)),
    )


async def move(pool: asyncpg.Pool, job: Job, status: str, **columns: object) -> None:
    """Set the job's status (and columns) as the services do: one UPDATE."""
    sets = ", ".join(f"{name} = ${i + 3}" for i, name in enumerate(columns))
    extra = f", {sets}" if sets else ""
    await pool.execute(
        f"UPDATE batches SET status = $2{extra} WHERE id = $1", job.id, status, *columns.values()
    )


async def test_the_timeline_lists_every_event_oldest_first(pool: asyncpg.Pool) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"tl-{new_id()[:6]}")
    job = await new_job(pool, workspace)
    await move(pool, job, "running", started_at=T0)
    await move(pool, job, "paused")
    await move(pool, job, "queued")  # resumed
    await move(pool, job, "running")
    stopped = datetime.now(UTC)
    await pool.execute("UPDATE batches SET budget_exceeded_at = $2 WHERE id = $1", job.id, stopped)
    await move(pool, job, "completed", completed_at=stopped + timedelta(seconds=0.5))
    await pool.execute(
        "INSERT INTO webhook_attempts (batch_id, attempt, status, response_status, error,"
        " attempted_at) VALUES ($1, 1, 'failed', 500, NULL, now() + interval '1 s'),"
        " ($1, 2, 'delivered', 204, NULL, now() + interval '2 s')",
        job.id,
    )
    fresh = await JobStore(pool).get(workspace, job.id)
    assert fresh is not None
    events, more = await TimelineStore(pool).timeline(fresh)
    shown = [e.to_api() for e in events]
    assert [e["event"] for e in shown] == [
        "started",  # T0 is before the job's creation (now): the order is by time
        "created",
        "paused",
        "resumed",
        "budget_reached",
        "finished",
        "webhook_attempt",
        "webhook_attempt",
    ]
    assert shown[5]["status"] == "completed"
    assert {k: shown[6][k] for k in ("attempt", "http_status", "status")} == {
        "attempt": 1,
        "http_status": 500,
        "status": "failed",
    }
    assert more is False
    await pool.execute("DELETE FROM webhook_attempts WHERE batch_id = $1", job.id)
    await pool.execute("DELETE FROM batches WHERE id = $1", job.id)  # the log goes with it
    assert (
        await pool.fetchval("SELECT count(*) FROM batch_status_log WHERE batch_id = $1", job.id)
        == 0
    )


async def test_usage_sums_per_day_and_model_within_the_range(pool: asyncpg.Pool) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"us-{new_id()[:6]}")
    other = await KeyStore(pool).ensure_workspace(f"us-{new_id()[:6]}")
    day1, day2 = T0, T0 + timedelta(days=1)
    made = []
    for ws, at, model, cost in (
        (workspace, day1, "gpt-4o-mini", 0.5),
        (workspace, day1 + timedelta(hours=3), "gpt-4o-mini", 0.25),
        (workspace, day1, "claude-haiku", 1.0),
        (workspace, day2, "gpt-4o-mini", 2.0),
        (workspace, day2 + timedelta(days=5), "gpt-4o-mini", 9.0),  # after the range
        (other, day1, "gpt-4o-mini", 7.0),  # another workspace
    ):
        job = await new_job(pool, ws, model)
        await pool.execute(
            "UPDATE batches SET created_at = $2, completed = 1, failed = 1, prompt_tokens = 10,"
            " completion_tokens = 3, cost_usd = $3 WHERE id = $1",
            job.id,
            at,
            cost,
        )
        made.append(job)
    lines = await UsageStore(pool).usage(workspace, day1.date(), day2.date())
    assert [line.to_api() for line in lines] == [
        {"day": "2026-11-03", "model": "claude-haiku", "jobs": 1, "rows": 2, "failed": 1,
         "prompt_tokens": 10, "completion_tokens": 3, "cost_usd": 1.0},
        {"day": "2026-11-03", "model": "gpt-4o-mini", "jobs": 2, "rows": 4, "failed": 2,
         "prompt_tokens": 20, "completion_tokens": 6, "cost_usd": 0.75},
        {"day": "2026-11-04", "model": "gpt-4o-mini", "jobs": 1, "rows": 2, "failed": 1,
         "prompt_tokens": 10, "completion_tokens": 3, "cost_usd": 2.0},
    ]  # fmt: skip
    async with pool.acquire() as conn:  # the statement can use the workspace list index
        await conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in await conn.fetch(
                "EXPLAIN " + USAGE_SQL, workspace, day1, day2 + timedelta(days=1)
            )
        )
        await conn.execute("RESET enable_seqscan")
    assert "batches_workspace_list" in plan, plan


def test_the_usage_range_defaults_to_30_days_and_refuses_a_bad_one() -> None:
    today = date(2026, 12, 7)
    assert usage_range(None, None, today) == (date(2026, 11, 8), today)
    assert usage_range("2026-12-01", "2026-12-02", today) == (date(2026, 12, 1), date(2026, 12, 2))
    for raw_from, raw_to, param in (
        ("2026-13-01", None, "from"),
        (None, "yesterday", "to"),
        ("2026-12-05", "2026-12-01", "from"),
        ("2026-01-01", "2026-12-01", "from"),
    ):
        with pytest.raises(ApiError) as raised:
            usage_range(raw_from, raw_to, today)
        assert (raised.value.status, raised.value.param) == (400, param)
