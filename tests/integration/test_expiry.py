"""Expiry against the real ledger and broker: due jobs end ``expired`` once, however many
reapers run, each announced once as a cancel and as finished; outcomes arriving after
are discarded and repeat the cancel with status ``expired``; a native submission and a
cron template's runs carry their completion window and metadata."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aio_pika
import aiohttp
import asyncpg
import pytest

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import EVENT_CANCELED, EVENT_FINISHED
from relay_batches.ids import new_id
from relay_batches.kit.base import BusService
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.expiry import ExpiryStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outbox import mark_finished_published
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.ledger.pool import create_pool
from relay_batches.ledger.schedule import ScheduleStore, SpawnedRun
from relay_batches.messages import JobEvent, OutcomesMessage, RowOutcome
from relay_batches.services.scheduler.core import Reaper, Scheduler
from relay_batches.services.scheduler.service import scheduler_service
from tests.helpers.support import ApiClient, Isolation, wait_until, watching

ROW = '[{"content":"x","role":"user"}]'


async def new_job(
    pool: asyncpg.Pool, workspace: str, *, rows: int = 3, cron: str | None = None, **extra: object
) -> str:
    """Store a job of ``rows`` rows (a template with ``cron``); return its id."""
    next_run = await pool.fetchval("SELECT clock_timestamp() - interval '1 second'")
    job = await JobStore(pool).create(
        NewJob(
            new_id(),
            workspace,
            "expiry",
            "gpt-4o-mini",
            0,
            rows,
            None,
            cron,
            next_run if cron else None,
            **extra,  # type: ignore[arg-type]
        ),
        ((f"c-{i}", ROW) for i in range(rows)),
    )
    return job.id


async def make_due(pool: asyncpg.Pool, batch_ids: list[str]) -> None:
    """Move these jobs' deadlines into the past."""
    await pool.execute(
        "UPDATE batches SET expires_at = now() - interval '1 second' WHERE id = ANY($1::text[])",
        batch_ids,
    )


async def status_of(pool: asyncpg.Pool, batch_id: str) -> str:
    status: str = await pool.fetchval("SELECT status FROM batches WHERE id = $1", batch_id)
    return status


async def events_for(
    queue: aio_pika.abc.AbstractQueue, batch_ids: set[str]
) -> list[tuple[str, JobEvent]]:
    """Every (routing key, event) of ``batch_ids`` on ``queue`` until it stays empty 1 s."""
    found: list[tuple[str, JobEvent]] = []
    while (message := await queue.get(fail=False, timeout=1)) is not None:
        await message.ack()
        event = JobEvent.decode(message.body)
        if event.batch_id in batch_ids:
            found.append((message.routing_key or "", event))
    return found


@pytest.fixture
async def watch(bus: Bus) -> AsyncIterator[aio_pika.abc.AbstractQueue]:
    """An exclusive queue bound to ``job.canceled`` and ``job.finished``."""
    async with watching(bus.names, EVENT_CANCELED, EVENT_FINISHED) as queue:
        yield queue


async def _always_ready() -> bool:
    return True


class Woken:
    """A dispatcher wake-up sink."""

    def __init__(self) -> None:
        self.runs: list[SpawnedRun] = []

    async def __call__(self, run: SpawnedRun) -> None:
        self.runs.append(run)


async def test_two_reapers_at_once_expire_each_due_job_once_and_announce_it_once(
    iso: Isolation, pool: asyncpg.Pool, bus: Bus, watch: aio_pika.abc.AbstractQueue
) -> None:
    """Two scheduler services, each with its own pool and a reaper of small pages every
    20 ms, race for 40 due jobs (half already running): each ends ``expired`` once and
    gets exactly one ``job.canceled`` and one ``job.finished``. A job not yet due, and a
    failed job whose deadline passed, are left alone."""
    workspace = await KeyStore(pool).ensure_workspace(f"exp-{new_id()[:6]}")
    due = [await new_job(pool, workspace, expires_at=None) for _ in range(40)]
    await pool.execute(
        "UPDATE batches SET status = 'running', started_at = now(), lease_owner = 'test-owner',"
        " lease_expires_at = now() + interval '1 minute' WHERE id = ANY($1::text[])",
        due[:20],
    )
    later = await new_job(pool, workspace)
    await pool.execute(
        "UPDATE batches SET expires_at = now() + interval '1 hour' WHERE id = $1", later
    )
    done = await new_job(pool, workspace)
    await pool.execute(
        "UPDATE batches SET status = 'failed', completed_at = now(),"
        " finished_published = true, expires_at = now() - interval '1 hour' WHERE id = $1",
        done,
    )
    pools = [await create_pool(iso.database_url, max_size=2) for _ in range(2)]
    services = [
        scheduler_service(
            bus,
            Scheduler(ScheduleStore(p), Woken()),
            _always_ready,
            max_sleep_s=60,
            grace_s=5,
            reaper=Reaper(
                ExpiryStore(p), bus.publish_event, functools.partial(mark_finished_published, p), 3
            ),
            expiry_interval_s=0.02,
        )
        for p in pools
    ]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(s.run(stop)) for s in services]
    try:
        for service in services:
            await wait_until(service.ready, 10, "both schedulers to run")
        await make_due(pool, due)

        async def all_expired() -> bool:
            statuses = await pool.fetch(
                "SELECT status, finished_published FROM batches WHERE id = ANY($1::text[])", due
            )
            return all(tuple(r) == ("expired", True) for r in statuses)

        await wait_until(all_expired, 20, "every due job to expire and be announced")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        for p in pools:
            await p.close()
    received = await events_for(watch, {*due, later, done})
    by_key = {
        key: sorted(e.batch_id for k, e in received if k == key)
        for key in (EVENT_CANCELED, EVENT_FINISHED)
    }
    assert by_key == {EVENT_CANCELED: sorted(due), EVENT_FINISHED: sorted(due)}
    assert {e.status for _, e in received} == {"expired"}
    assert (await status_of(pool, later), await status_of(pool, done)) == ("queued", "failed")
    leases = await pool.fetchval(
        "SELECT count(*) FROM batches WHERE id = ANY($1::text[]) AND lease_owner IS NOT NULL", due
    )
    assert leases == 0


async def test_outcomes_after_expiry_are_discarded_and_repeat_the_cancel_as_expired(
    pool: asyncpg.Pool, bus: Bus, aggregator: BusService, watch: aio_pika.abc.AbstractQueue
) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"exp-{new_id()[:6]}")
    batch_id = await new_job(pool, workspace, rows=3)
    await DispatchStore(pool).claim_queued("test-owner", 1000, 30)
    before = OutcomesMessage((RowOutcome(batch_id, 0, "kept", None, attempts=1),))
    await bus.publish(bus.names.results, before.encode(), kind="results")

    async def first_recorded() -> bool:
        return bool(await pool.fetchval("SELECT completed FROM batches WHERE id = $1", batch_id))

    await wait_until(first_recorded, 15, "the first outcome to be recorded")
    await make_due(pool, [batch_id])
    [expired] = await ExpiryStore(pool).expire_due(10)
    assert (expired.id, expired.total, expired.completed, expired.failed) == (batch_id, 3, 1, 0)
    late = OutcomesMessage(tuple(RowOutcome(batch_id, i, "late", None, attempts=1) for i in (1, 2)))
    await bus.publish(bus.names.results, late.encode(), kind="results")

    async def outbox_announced() -> bool:
        published: bool = await pool.fetchval(
            "SELECT finished_published FROM batches WHERE id = $1", batch_id
        )
        return published

    await wait_until(outbox_announced, 15, "the outbox to announce the expired job")
    received = await events_for(watch, {batch_id})
    assert sorted((key, e.status) for key, e in received) == [
        (EVENT_CANCELED, "expired"),
        (EVENT_FINISHED, "expired"),
    ]
    results = await pool.fetch(
        "SELECT row_index, content FROM row_results WHERE batch_id = $1 ORDER BY row_index",
        batch_id,
    )
    assert [tuple(r) for r in results] == [(0, "kept")]
    assert await status_of(pool, batch_id) == "expired"


async def test_each_run_of_a_template_has_the_templates_window_from_its_spawn(
    pool: asyncpg.Pool,
) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"exp-{new_id()[:6]}")
    window = timedelta(minutes=30)
    template_id = await new_job(
        pool, workspace, cron="* * * * *", completion_window=window, metadata='{"team":"a"}'
    )
    scheduler = Scheduler(ScheduleStore(pool), Woken())
    try:
        result = await scheduler.tick(await ScheduleStore(pool).now())
    finally:
        await pool.execute(
            "UPDATE batches SET status = 'canceled', next_run_at = NULL WHERE id = $1",
            template_id,
        )
    [run] = [r for r in result.spawned if r.template_id == template_id]
    record = await pool.fetchrow(
        "SELECT expires_at - created_at AS left, metadata, completion_window"
        " FROM batches WHERE id = $1",
        run.id,
    )
    assert tuple(record) == (window, '{"team":"a"}', window)
    assert await pool.fetchval("SELECT expires_at FROM batches WHERE id = $1", template_id) is None


async def test_a_native_submission_shows_its_deadline_and_metadata(client_a: ApiClient) -> None:
    created = await client_a.submit(
        {
            "model": "gpt-4o-mini",
            "requests": [{"messages": [{"role": "user", "content": "hi"}]}],
            "completion_window": "2h",
            "metadata": {"team": "search", "run": "7"},
        }
    )
    shown = await client_a.get(created["id"])
    assert shown["metadata"] == {"team": "search", "run": "7"}
    left = _instant(shown["expires_at"]) - _instant(shown["created_at"])
    assert abs(left - timedelta(hours=2)) <= timedelta(seconds=5)
    status, body = await client_a.request(
        "POST",
        "/v1/batches",
        json={
            "model": "gpt-4o-mini",
            "requests": [{"messages": [{"role": "user", "content": "hi"}]}],
            "completion_window": "8d",
        },
    )
    assert status == 400
    assert body["error"]["param"] == "completion_window"


def _instant(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


async def test_an_upload_gives_each_files_job_the_window_and_metadata(
    client_a: ApiClient,
) -> None:
    data = aiohttp.FormData(default_to_multipart=True)
    data.add_field("model", "gpt-4o-mini")
    data.add_field("completion_window", "45m")
    data.add_field("metadata", '{"source": "upload"}')
    for name in ("a.csv", "b.csv"):
        data.add_field("file", b"hello\n", filename=name, content_type="text/plain")
    status, body = await client_a.request("POST", "/v1/batches/upload", data=data)
    assert status == 201, body
    for job in body["data"]:
        assert job["metadata"] == {"source": "upload"}
        left = _instant(job["expires_at"]) - _instant(job["created_at"])
        assert abs(left - timedelta(minutes=45)) <= timedelta(seconds=5)
    bad = aiohttp.FormData(default_to_multipart=True)
    bad.add_field("model", "gpt-4o-mini")
    bad.add_field("metadata", '{"source": 1}')
    bad.add_field("file", b"hello\n", filename="a.csv", content_type="text/plain")
    status, body = await client_a.request("POST", "/v1/batches/upload", data=bad)
    assert status == 400
    assert body["error"]["param"] == "metadata.source"


async def end_as_reaped(pool: asyncpg.Pool, batch_ids: list[str]) -> None:
    """End these jobs as the reaper would, announced: nothing of them is left live in
    the shared session database."""
    await pool.execute(
        "UPDATE batches SET status = 'expired', completed_at = now(), finished_published = true,"
        " lease_owner = NULL, lease_expires_at = NULL WHERE id = ANY($1::text[])",
        batch_ids,
    )


async def test_the_deadline_is_the_window_after_the_insert_on_the_database_clock(
    pool: asyncpg.Pool,
) -> None:
    """The reaper and the claims compare with the database's now(): the deadline is set
    on that clock, exactly the window after the job's created_at."""
    workspace = await KeyStore(pool).ensure_workspace(f"exp-{new_id()[:6]}")
    window = timedelta(minutes=7)
    batch_id = await new_job(pool, workspace, completion_window=window)
    left = await pool.fetchval(
        "SELECT expires_at - created_at FROM batches WHERE id = $1", batch_id
    )
    assert left == window


async def test_a_job_past_its_deadline_is_never_claimed_even_without_a_reaper(
    pool: asyncpg.Pool,
) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"exp-{new_id()[:6]}")
    due = await new_job(pool, workspace, completion_window=timedelta(hours=1))
    live = await new_job(pool, workspace, completion_window=timedelta(hours=1))
    await make_due(pool, [due])
    store = DispatchStore(pool)
    claimed = {j.id for j in await store.claim_outranking("exp-owner", {workspace: -1}, 10, 30)}
    claimed |= {j.id for j in await store.claim_queued("exp-owner", 1000, 30)}
    assert (due in claimed, live in claimed) == (False, True)
    assert (await status_of(pool, due), await status_of(pool, live)) == ("queued", "running")
    await end_as_reaped(pool, [due, live])


async def test_outcomes_past_the_deadline_are_not_recorded_even_without_a_reaper(
    pool: asyncpg.Pool,
) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"exp-{new_id()[:6]}")
    batch_id = await new_job(pool, workspace, rows=2, completion_window=timedelta(hours=1))
    await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", batch_id)
    store = OutcomeStore(pool)
    assert len(await store.record([RowOutcome(batch_id, 0, "in time", None, attempts=1)])) == 1
    await make_due(pool, [batch_id])
    assert await store.record([RowOutcome(batch_id, 1, "too late", None, attempts=1)]) == []
    results = await pool.fetch(
        "SELECT row_index, content FROM row_results WHERE batch_id = $1 ORDER BY row_index",
        batch_id,
    )
    assert [tuple(r) for r in results] == [(0, "in time")]
    assert await status_of(pool, batch_id) == "running"
    await end_as_reaped(pool, [batch_id])
