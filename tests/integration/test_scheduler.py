"""The scheduler against the real ledger and broker: one run per tick, never two.

Most tests drive :meth:`Scheduler.tick` with a simulated clock in 2030, so real time
never matters; one starts two ``relay-scheduler`` processes side by side.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import EVENT_TEMPLATE_CREATED
from relay_batches.ids import new_id
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.pool import create_pool
from relay_batches.ledger.schedule import ScheduleStore, SpawnedRun
from relay_batches.messages import TemplateCreated
from relay_batches.services.scheduler.core import Scheduler, TickResult
from relay_batches.services.scheduler.service import scheduler_service
from tests.helpers.processes import ServiceProcess
from tests.helpers.support import ApiClient, Isolation, wait_until, watching

T0 = datetime(2030, 1, 1, 0, 0, 30, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


@pytest.fixture(autouse=True)
async def no_template_outlives_its_test(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Every scheduler here spawns for any due template: cancel leftovers after a test."""
    yield
    await pool.execute(
        "UPDATE batches SET status = 'canceled', next_run_at = NULL WHERE status = 'scheduled'"
    )


async def make_template(
    pool: asyncpg.Pool,
    cron: str,
    next_run_at: datetime,
    *,
    name: str = "nightly",
    budget_usd: float | None = None,
) -> str:
    """Store a 3-row cron template directly; return its id."""
    workspace = await KeyStore(pool).ensure_workspace(f"sched-{new_id()[:6]}")
    batch = await JobStore(pool).create(
        NewJob(
            new_id(),
            workspace,
            name,
            "gpt-4o-mini",
            4,
            3,
            "http://127.0.0.1:9/hook",
            cron,
            next_run_at,
            '{"temperature":0}',
            budget_usd=budget_usd,
        ),
        ((f"c-{i}", '[{"role":"user","content":"x"}]') for i in range(3)),
    )
    return batch.id


async def runs_of(pool: asyncpg.Pool, template_id: str) -> list[asyncpg.Record]:
    """Every run of ``template_id``, by tick."""
    return await pool.fetch(
        "SELECT * FROM batches WHERE template_id = $1 ORDER BY tick", template_id
    )


class Woken:
    """A dispatcher wake-up sink that records what it was told."""

    def __init__(self) -> None:
        self.runs: list[SpawnedRun] = []

    async def __call__(self, run: SpawnedRun) -> None:
        self.runs.append(run)


def scheduler_on(pool: asyncpg.Pool, woken: Woken | None = None) -> Scheduler:
    """A scheduler on ``pool`` (no bus: wake-ups are recorded)."""
    return Scheduler(ScheduleStore(pool), woken or Woken())


def simulated_minutes(start: datetime, minutes: int, step_s: int = 13) -> list[datetime]:
    """Clock readings every ``step_s`` seconds for ``minutes`` minutes after ``start``."""
    return [start + timedelta(seconds=s) for s in range(0, minutes * 60 + 1, step_s)]


async def test_every_minute_template_spawns_exactly_one_run_per_minute(
    pool: asyncpg.Pool,
) -> None:
    template_id = await make_template(pool, "* * * * *", T0 + timedelta(seconds=30))
    woken = Woken()
    scheduler = scheduler_on(pool, woken)
    for now in simulated_minutes(T0, 10):
        await scheduler.tick(now)

    runs = await runs_of(pool, template_id)
    expected = [T0 + timedelta(seconds=30) + i * MINUTE for i in range(10)]
    assert [r["tick"] for r in runs] == expected
    assert sorted(r.id for r in woken.runs if r.template_id == template_id) == sorted(
        r["id"] for r in runs
    )
    template = await pool.fetchrow("SELECT * FROM batches WHERE id = $1", template_id)
    assert template["status"] == "scheduled"
    assert template["next_run_at"] == expected[-1] + MINUTE
    for run in runs:
        assert run["id"] != template_id
        assert run["status"] == "queued"
        assert (run["rows_batch_id"], run["template_id"]) == (template_id, template_id)
        assert (run["model"], run["priority"], run["total"], run["params"]) == (
            "gpt-4o-mini",
            4,
            3,
            '{"temperature":0}',
        )
        assert run["webhook_url"] == template["webhook_url"]
        assert run["cron"] is None and run["next_run_at"] is None
        assert run["name"] == f"nightly @ {run['tick'].strftime('%Y-%m-%dT%H:%M:%SZ')}"
    rows = await pool.fetchval(
        "SELECT count(*) FROM batch_rows WHERE batch_id = ANY($1)", [r["id"] for r in runs]
    )
    assert rows == 0, "a run must reuse its template's rows, not copy them"


async def test_every_run_gets_its_templates_budget(pool: asyncpg.Pool) -> None:
    first = T0 + timedelta(seconds=30)
    template_id = await make_template(pool, "* * * * *", first, budget_usd=1.5)
    scheduler = scheduler_on(pool)
    for now in simulated_minutes(T0, 2):
        await scheduler.tick(now)
    runs = await runs_of(pool, template_id)
    assert [r["budget_usd"] for r in runs] == [1.5, 1.5]
    assert [r["cost_usd"] for r in runs] == [0, 0]


async def test_a_ten_minute_gap_spawns_one_run_for_the_latest_tick(pool: asyncpg.Pool) -> None:
    first = T0 + timedelta(seconds=30)
    template_id = await make_template(pool, "* * * * *", first)
    scheduler = scheduler_on(pool)
    back = first + 10 * MINUTE + timedelta(seconds=5)
    result = await scheduler.tick(back)
    assert [r.template_id for r in result.spawned].count(template_id) == 1
    assert [r["tick"] for r in await runs_of(pool, template_id)] == [first + 10 * MINUTE]
    nxt = await pool.fetchval("SELECT next_run_at FROM batches WHERE id = $1", template_id)
    assert nxt == first + 11 * MINUTE
    assert result.wake_at is not None and result.wake_at <= nxt

    await scheduler.tick(back)
    assert len(await runs_of(pool, template_id)) == 1


async def test_two_schedulers_side_by_side_never_spawn_a_tick_twice(
    pool: asyncpg.Pool, iso: Isolation
) -> None:
    templates = [
        await make_template(pool, "* * * * *", T0 + timedelta(seconds=30)) for _ in range(20)
    ]
    other_pool = await create_pool(iso.database_url, max_size=3)
    try:
        a, b = scheduler_on(pool), scheduler_on(other_pool)
        for now in simulated_minutes(T0, 10, step_s=29):
            await asyncio.gather(a.tick(now), b.tick(now), a.tick(now), b.tick(now))
    finally:
        await other_pool.close()
    for template_id in templates:
        ticks = [r["tick"] for r in await runs_of(pool, template_id)]
        assert ticks == [T0 + timedelta(seconds=30) + i * MINUTE for i in range(10)]


async def test_a_canceled_template_spawns_nothing_more(
    pool: asyncpg.Pool, client_a: ApiClient
) -> None:
    created = await client_a.submit(
        {"model": "gpt-4o-mini", "cron": "*/5 * * * *", "requests": [{"messages": _hello()}]}
    )
    assert created["status"] == "scheduled"
    template_id = created["id"]
    scheduler = scheduler_on(pool)
    due = datetime.fromisoformat(created["next_run_at"].replace("Z", "+00:00"))
    await scheduler.tick(due + timedelta(seconds=1))
    assert len(await runs_of(pool, template_id)) == 1

    status, canceled = await client_a.request("POST", f"/v1/batches/{template_id}/cancel")
    assert status == 200
    assert (canceled["status"], canceled["next_run_at"]) == ("canceled", None)
    for now in simulated_minutes(due, 30, step_s=60):
        await scheduler.tick(now + timedelta(hours=1))
    assert len(await runs_of(pool, template_id)) == 1


def _hello() -> list[dict[str, str]]:
    return [{"role": "user", "content": "hello"}]


async def test_list_by_template_id_shows_only_that_templates_runs(
    pool: asyncpg.Pool, client_a: ApiClient, client_b: ApiClient
) -> None:
    body = {"model": "gpt-4o-mini", "cron": "0 * * * *", "requests": [{"messages": _hello()}]}
    template = await client_a.submit(body)
    other = await client_a.submit(body)
    due = datetime.fromisoformat(template["next_run_at"].replace("Z", "+00:00"))
    scheduler = scheduler_on(pool)
    for hour in range(3):
        await scheduler.tick(due + timedelta(hours=hour, seconds=1))

    status, page = await client_a.request("GET", f"/v1/batches?template_id={template['id']}")
    assert status == 200
    runs = page["data"]
    assert len(runs) == 3
    assert {r["template_id"] for r in runs} == {template["id"]}
    assert [r["created_at"] for r in runs] == sorted((r["created_at"] for r in runs), reverse=True)
    assert all(r["status"] == "queued" and r["cron"] is None for r in runs)
    other_runs = await client_a.request("GET", f"/v1/batches?template_id={other['id']}")
    assert len(other_runs[1]["data"]) == 3
    assert {r["id"] for r in other_runs[1]["data"]}.isdisjoint(r["id"] for r in runs)

    status, limited = await client_a.request(
        "GET", f"/v1/batches?template_id={template['id']}&limit=2"
    )
    assert (status, len(limited["data"]), limited["has_more"]) == (200, 2, True)
    assert (await client_b.request("GET", f"/v1/batches?template_id={template['id']}")) == (
        200,
        {"object": "list", "data": [], "has_more": False},
    )
    status, error = await client_a.request("GET", "/v1/batches?template_id=nope")
    assert status == 400
    assert error["error"]["param"] == "template_id"


async def test_a_scheduler_whose_clock_runs_90_s_fast_waits_for_the_databases_clock(
    pool: asyncpg.Pool,
) -> None:
    """Due is what the database's clock says: a replica 90 s fast neither runs a template
    due in a minute nor sleeps as if it were late."""
    db_now = await pool.fetchval("SELECT clock_timestamp()")
    template_id = await make_template(pool, "* * * * *", db_now + MINUTE)
    scheduler = scheduler_on(pool)

    def fast() -> datetime:
        return datetime.now(UTC) + timedelta(seconds=90)

    sleep_s = await scheduler.spawn_pass(fast, 300)
    assert await runs_of(pool, template_id) == []
    assert 30 < sleep_s <= 60

    await pool.execute(
        "UPDATE batches SET next_run_at = clock_timestamp() - interval '1 second' WHERE id = $1",
        template_id,
    )
    await scheduler.spawn_pass(fast, 300)
    assert len(await runs_of(pool, template_id)) == 1


async def test_a_new_template_wakes_a_sleeping_scheduler(pool: asyncpg.Pool, bus: Bus) -> None:
    """The service sleeps up to its cap (here 60 s); a ``template.created`` event (the API
    publishes one per template, see the next test) cuts the sleep short. The template is
    stored already due by the database's clock, after the first pass."""
    passes = 0
    store = ScheduleStore(pool)

    class CountingScheduler(Scheduler):
        async def tick(self, now: datetime) -> TickResult:
            nonlocal passes
            passes += 1
            return await super().tick(now)

    service = scheduler_service(
        bus, CountingScheduler(store, Woken()), _always_ready, max_sleep_s=60, grace_s=5
    )
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        await wait_until(service.ready, 10, "the scheduler to consume wake-ups")

        async def first_pass_done() -> bool:
            return passes > 0

        await wait_until(first_pass_done, 10, "the first pass")
        passes_before = passes
        due = await pool.fetchval("SELECT clock_timestamp() - interval '1 second'")
        template_id = await make_template(pool, "* * * * *", due)
        created = TemplateCreated(template_id, due.isoformat())
        await bus.publish_event(EVENT_TEMPLATE_CREATED, created.encode())

        async def spawned() -> bool:
            return bool(await runs_of(pool, template_id))

        await wait_until(spawned, 10, "the new template's first run")
        assert passes - passes_before <= 2, "the scheduler polled instead of sleeping"
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def _always_ready() -> bool:
    return True


async def test_create_publishes_template_created(bus: Bus, client_a: ApiClient) -> None:
    async with watching(bus.names, EVENT_TEMPLATE_CREATED) as watch:
        created = await client_a.submit(
            {"model": "gpt-4o-mini", "cron": "0 3 * * *", "requests": [{"messages": _hello()}]}
        )
        message = await wait_until(
            lambda: watch.get(fail=False, timeout=5), 10, "the template.created event"
        )
        await message.ack()
        assert TemplateCreated.decode(message.body) == TemplateCreated(
            created["id"], created["next_run_at"]
        )


async def test_two_scheduler_processes_spawn_each_backlog_once(
    pool: asyncpg.Pool, bus: Bus, iso: Isolation, output_dir: Path
) -> None:
    """Two real ``relay-scheduler`` processes race over 100 templates a year behind,
    created while both run (each created template also wakes both): each template gets
    exactly one run, for its latest tick, whichever process spawned it."""
    now = datetime.now(UTC)
    last_year = datetime(now.year - 1, 1, 1, tzinfo=UTC)
    log_dir = output_dir / "integration"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "RELAY_DATABASE_URL": iso.database_url,
        "RELAY_NAMESPACE": iso.namespace,
        "RELAY_HEALTH_PORT": "0",
        "RELAY_SCHEDULER_MAX_SLEEP_S": "0.2",
    }
    processes = [ServiceProcess("scheduler", env, log_dir / f"scheduler-{n}.log") for n in (1, 2)]
    for process in processes:
        process.log_path.unlink(missing_ok=True)
        process.start()
    try:
        async with aiohttp.ClientSession() as http:
            for process in processes:
                await process.wait_ready(http)
        templates = []
        for _ in range(100):
            templates.append(await make_template(pool, "0 0 1 1 *", last_year))
            created = TemplateCreated(templates[-1], last_year.isoformat())
            await bus.publish_event(EVENT_TEMPLATE_CREATED, created.encode())

        async def all_spawned() -> bool:
            count = await pool.fetchval(
                "SELECT count(DISTINCT template_id) FROM batches WHERE template_id = ANY($1)",
                templates,
            )
            return count == len(templates)

        await wait_until(all_spawned, 30, "a run for every template")
    finally:
        codes = [process.stop() for process in processes]
    assert codes == [0, 0]
    this_year = datetime(now.year, 1, 1, tzinfo=UTC)
    for template_id in templates:
        assert [r["tick"] for r in await runs_of(pool, template_id)] == [this_year]
    spawned = [process.log_path.read_text().count('"run_spawned"') for process in processes]
    assert sum(spawned) == len(templates), spawned
