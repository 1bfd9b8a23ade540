"""``DELETE /v1/batches/{id}`` over HTTP on the real ledger: an ended batch or a cron
template goes with everything stored for it, then every endpoint answers 404; a queued,
running or paused batch is a 409; a deleted template spawns nothing, its runs keep
working, and its rows go with the last run that used them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import asyncpg

from relay_batches.ledger.deletion import Deleted, delete_job
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.ledger.schedule import ScheduleStore
from relay_batches.messages import RowOutcome
from relay_batches.services.scheduler.core import plan_ticks
from tests.helpers.support import ApiClient, rows, wait_until

LONG_AGO = datetime(2001, 1, 1, tzinfo=UTC)  # due before any other test's template

TABLES = (
    ("batches", "id"),
    ("batch_rows", "batch_id"),
    ("row_results", "batch_id"),
    ("webhook_deliveries", "batch_id"),
    ("webhook_attempts", "batch_id"),
)


async def counts(pool: asyncpg.Pool, batch_id: str) -> dict[str, int]:
    """How many rows of each table name ``batch_id`` (idempotency records by their body)."""
    found = {
        table: await pool.fetchval(f"SELECT count(*) FROM {table} WHERE {column} = $1", batch_id)
        for table, column in TABLES
    }
    found["idempotency_keys"] = await pool.fetchval(
        "SELECT count(*) FROM idempotency_keys WHERE strpos(response_body, $1) > 0", batch_id
    )
    return found


NOTHING = {table: 0 for table, _ in TABLES} | {"idempotency_keys": 0}


async def delete(api: ApiClient, batch_id: str) -> tuple[int, Any]:
    return await api.request("DELETE", f"/v1/batches/{batch_id}")


async def ended(pool: asyncpg.Pool, api: ApiClient, key: str | None = None) -> dict[str, Any]:
    """A completed 2-row batch submitted through the API (r-1 dead-lettered), with a
    webhook delivery and one logged attempt."""
    headers = {"Idempotency-Key": key} if key else {}
    status, batch = await api.request(
        "POST",
        "/v1/batches",
        json={"model": "gpt-4o-mini", "requests": rows(2), "webhookUrl": "http://127.0.0.1:9/"},
        headers=headers,
    )
    assert status == 201, batch
    status, _ = await api.request("POST", f"/v1/batches/{batch['id']}/pause")
    assert status == 200
    await OutcomeStore(pool).record(
        [
            RowOutcome(batch["id"], 0, "ok", None, attempts=1),
            RowOutcome(batch["id"], 1, None, "upstream_error: 503", 4, dead_letter=True),
        ]
    )
    await pool.execute(
        "INSERT INTO webhook_deliveries (batch_id, url, status) VALUES ($1, 'http://h/', 'failed')"
        " ON CONFLICT (batch_id, endpoint_id) DO NOTHING",
        batch["id"],
    )
    await pool.execute(
        "INSERT INTO webhook_attempts (batch_id, attempt, status) VALUES ($1, 1, 'failed')",
        batch["id"],
    )
    return await api.get(batch["id"])


async def assert_gone_everywhere(api: ApiClient, batch_id: str) -> None:
    """Every native endpoint naming ``batch_id`` answers 404 naming ``id``."""
    calls = [("GET", ""), ("DELETE", "")]
    calls += [("GET", f"/{sub}") for sub in ("results", "dead_letter", "stats")]
    calls += [("GET", "/webhook_deliveries"), ("POST", "/webhook_deliveries")]
    calls += [("POST", f"/{verb}") for verb in ("retry", "cancel", "pause", "resume")]
    for method, suffix in calls:
        status, body = await api.request(method, f"/v1/batches/{batch_id}{suffix}")
        assert (status, body["error"]["param"]) == (404, "id"), (method, suffix, body)
    status, page = await api.request("GET", "/v1/batches?limit=100")
    assert status == 200 and batch_id not in [b["id"] for b in page["data"]]


async def test_an_ended_batch_is_deleted_with_everything_stored_for_it(
    pool: asyncpg.Pool, client_a: ApiClient
) -> None:
    batch = await ended(pool, client_a, key="delete-me-1")
    assert batch["status"] == "completed"
    before = await counts(pool, batch["id"])
    assert before == {
        "batches": 1,
        "batch_rows": 2,
        "row_results": 2,
        "webhook_deliveries": 1,
        "webhook_attempts": 1,
        "idempotency_keys": 1,
    }

    status, body = await delete(client_a, batch["id"])

    assert (status, body) == (200, {"id": batch["id"], "object": "batch.deleted", "deleted": True})
    assert await counts(pool, batch["id"]) == NOTHING
    await assert_gone_everywhere(client_a, batch["id"])


async def test_another_workspace_gets_a_404_and_deletes_nothing(
    pool: asyncpg.Pool, client_a: ApiClient, client_b: ApiClient
) -> None:
    batch = await ended(pool, client_a)
    status, body = await delete(client_b, batch["id"])
    assert (status, body["error"]["param"]) == (404, "id")
    assert (await counts(pool, batch["id"]))["row_results"] == 2


async def test_a_batch_that_has_not_ended_is_a_409_and_stays(
    pool: asyncpg.Pool, client_a: ApiClient
) -> None:
    queued = await client_a.submit({"model": "gpt-4o-mini", "requests": rows(2)})
    running = await client_a.submit({"model": "gpt-4o-mini", "requests": rows(2)})
    await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", running["id"])
    paused = await client_a.submit({"model": "gpt-4o-mini", "requests": rows(2)})
    status, _ = await client_a.request("POST", f"/v1/batches/{paused['id']}/pause")
    assert status == 200

    for batch, state in ((queued, "queued"), (running, "running"), (paused, "paused")):
        status, body = await delete(client_a, batch["id"])
        assert status == 409, body
        assert (body["error"]["type"], body["error"]["param"]) == ("conflict_error", "id")
        assert state in body["error"]["message"]
        assert (await client_a.get(batch["id"]))["status"] == state
        assert (await counts(pool, batch["id"]))["batch_rows"] == 2
    await pool.execute(
        "UPDATE batches SET status = 'canceled' WHERE id = ANY($1::text[])",
        [queued["id"], running["id"], paused["id"]],
    )


async def spawn(pool: asyncpg.Pool, tick: datetime) -> list[str]:
    """The scheduler's pass at ``tick`` over the templates due by then: the runs made."""
    _, runs = await ScheduleStore(pool).spawn_due(tick, 10, partial(plan_ticks, now=tick))
    return [run.id for run in runs]


async def finish_run(pool: asyncpg.Pool, run_id: str) -> None:
    await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", run_id)
    await OutcomeStore(pool).record(
        [RowOutcome(run_id, i, f"answer {i}", None, attempts=1) for i in range(2)]
    )


async def test_a_template_goes_its_runs_stay_and_the_last_run_takes_the_rows(
    pool: asyncpg.Pool, client_a: ApiClient
) -> None:
    template = await client_a.submit(
        {"model": "gpt-4o-mini", "cron": "* * * * *", "requests": rows(2)}
    )
    await pool.execute(
        "UPDATE batches SET next_run_at = $2 WHERE id = $1", template["id"], LONG_AGO
    )
    first = await spawn(pool, LONG_AGO)
    second = await spawn(pool, LONG_AGO + timedelta(minutes=1))
    assert len(first) == len(second) == 1
    await finish_run(pool, first[0])

    status, body = await delete(client_a, template["id"])

    assert (status, body["object"], body["deleted"]) == (200, "batch.deleted", True)
    await assert_gone_everywhere(client_a, template["id"])
    assert await spawn(pool, LONG_AGO + timedelta(minutes=5)) == []  # nothing spawned
    assert await counts(pool, template["id"]) == {**NOTHING, "batch_rows": 2}
    done = await client_a.get(first[0])
    assert (done["status"], done["template_id"]) == ("completed", None)
    answers = await client_a.results(first[0])
    assert [r["content"] for r in answers["data"]] == ["answer 0", "answer 1"]
    live = await client_a.get(second[0])  # still queued: it runs the template's rows
    assert (live["status"], live["template_id"], live["total"]) == ("queued", None, 2)

    assert (await delete(client_a, first[0]))[0] == 200
    assert (await counts(pool, template["id"]))["batch_rows"] == 2  # the second still runs
    status, _ = await delete(client_a, second[0])
    assert status == 409
    await finish_run(pool, second[0])
    assert [r["content"] for r in (await client_a.results(second[0]))["data"]] == [
        "answer 0",
        "answer 1",
    ]
    assert (await delete(client_a, second[0]))[0] == 200
    assert await counts(pool, template["id"]) == NOTHING  # no orphaned rows
    assert await counts(pool, second[0]) == NOTHING


async def test_a_deleted_retry_leaves_its_originals_retries(
    pool: asyncpg.Pool, client_a: ApiClient
) -> None:
    original = await ended(pool, client_a)
    status, retry = await client_a.request(
        "POST", f"/v1/batches/{original['id']}/retry", json={"rows": "dead_letter"}
    )
    assert status == 201 and retry["retry_of"] == original["id"], retry
    assert (await client_a.get(original["id"]))["retries"] == [retry["id"]]
    await pool.execute("UPDATE batches SET status = 'canceled' WHERE id = $1", retry["id"])

    assert (await delete(client_a, retry["id"]))[0] == 200
    assert (await client_a.get(original["id"]))["retries"] == []

    second = await client_a.request("POST", f"/v1/batches/{original['id']}/retry")
    assert second[0] == 201
    await pool.execute("UPDATE batches SET status = 'canceled' WHERE id = $1", second[1]["id"])
    assert (await delete(client_a, original["id"]))[0] == 200
    kept = await client_a.get(second[1]["id"])
    assert (kept["retry_of"], kept["total"]) == (None, 1)
    assert (await counts(pool, second[1]["id"]))["batch_rows"] == 1


async def _waiting_for_a_lock(observer: asyncpg.Pool, pid: int) -> bool:
    event = await observer.fetchval(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", pid
    )
    return bool(event == "Lock")


async def test_the_last_two_runs_deleted_at_once_leave_no_rows_behind(
    pool: asyncpg.Pool, client_a: ApiClient
) -> None:
    """Each deletion would see the other run still there and keep the rows for it; the
    advisory lock on the rows id makes the second wait for the first, then free them."""
    template = await client_a.submit(
        {"model": "gpt-4o-mini", "cron": "* * * * *", "requests": rows(2)}
    )
    await pool.execute(
        "UPDATE batches SET next_run_at = $2 WHERE id = $1", template["id"], LONG_AGO
    )
    runs = await spawn(pool, LONG_AGO) + await spawn(pool, LONG_AGO + timedelta(minutes=1))
    for run_id in runs:
        await finish_run(pool, run_id)
    assert (await delete(client_a, template["id"]))[0] == 200
    workspace_id = await pool.fetchval("SELECT workspace_id FROM batches WHERE id = $1", runs[0])
    first, second = await pool.acquire(), await pool.acquire()
    try:
        second_pid = await second.fetchval("SELECT pg_backend_pid()")
        async with first.transaction():
            assert await delete_job(first, workspace_id, runs[0]) is Deleted.DELETED
            deleting = asyncio.create_task(delete_job(second, workspace_id, runs[1]))
            await wait_until(
                lambda: _waiting_for_a_lock(pool, second_pid),
                10,
                "the second deletion to wait for the first",
            )
        assert await asyncio.wait_for(deleting, 10) is Deleted.DELETED
    finally:
        await pool.release(first)
        await pool.release(second)
    assert await counts(pool, template["id"]) == NOTHING
    assert [await counts(pool, run_id) for run_id in runs] == [NOTHING, NOTHING]
