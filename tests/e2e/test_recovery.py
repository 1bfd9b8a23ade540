"""Recovery end to end, on a system of its own: SIGTERM, reconnects, cron runs.

The services reach RabbitMQ and Postgres through loopback proxies owned by this module,
so a "server outage" cuts and refuses only this system's connections; the shared
servers are never restarted (other test runs use them at the same time). On top,
RabbitMQ itself closes this namespace's connections (``rabbitmqctl close_connection``)
and Postgres terminates this database's backends (``pg_terminate_backend``), which is
what each server does to its clients when it shuts down.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import aiohttp
import asyncpg
import pytest

from relay_batches.bus.topology import Names
from relay_batches.services.relay_cli import admin
from tests.helpers.checks import (
    assert_exactly_once,
    readyz,
    services_of,
    wait_all_not_ready,
    wait_all_ready,
    wait_terminal,
)
from tests.helpers.faults import (
    TcpProxy,
    close_broker_connections,
    server_proxies,
    terminate_db_backends,
)
from tests.helpers.processes import ServiceProcess, System, build_system
from tests.helpers.support import (
    AMQP_URL,
    ApiClient,
    WebhookReceiver,
    create_isolation,
    drop_isolation,
    rows,
    wait_until,
)

DB_SERVICES = ("ingest-api", "scheduler", "dispatcher", "aggregator", "notifier", "offloader")
GRACE_S = 10  # RELAY_SHUTDOWN_GRACE_S of build_system


@pytest.fixture(scope="module")
async def proxies() -> AsyncIterator[tuple[TcpProxy, TcpProxy]]:
    """A proxy in front of RabbitMQ and one in front of Postgres, for this module only."""
    async with server_proxies() as both:
        yield both


@pytest.fixture(scope="module")
async def rsystem(
    output_dir: Path, http: aiohttp.ClientSession, proxies: tuple[TcpProxy, TcpProxy]
) -> AsyncIterator[System]:
    """Every service as its own process, two row-workers, both servers behind proxies."""
    amqp, pg = proxies
    iso = await create_isolation("rec")
    log_dir = output_dir / "e2e-recovery"
    for old in log_dir.glob("*.log"):
        old.unlink()
    system = build_system(
        iso,
        log_dir,
        workers=2,
        RELAY_AMQP_URL=f"amqp://guest:guest@127.0.0.1:{amqp.port}/",
        RELAY_DATABASE_URL=f"postgresql://postgres@127.0.0.1:{pg.port}/{iso.database}",
        RELAY_BATCH_CONCURRENCY="4",
        RELAY_DISPATCH_WINDOW="128",
        RELAY_LEASE_SECONDS="5",
        RELAY_SCHEDULER_MAX_SLEEP_S="1",
        RELAY_STALL_SECONDS="3",
    )
    try:
        await system.start_all(http)
        yield system
    finally:
        # In a thread: the proxies live on this event loop and must keep forwarding while
        # the services drain and close their connections.
        codes = await asyncio.to_thread(system.stop_all)
        await drop_isolation(iso)
    assert all(code == 0 for code in codes.values()), f"unclean exits: {codes}"


@pytest.fixture(scope="module")
async def rapi(rsystem: System, http: aiohttp.ClientSession) -> ApiClient:
    """A client of this module's API."""
    created = await admin.create_key(rsystem.iso.database_url, "recovery")
    return ApiClient(rsystem.api_url, created.key, http)


async def submit(
    api: ApiClient, n: int, webhooks: WebhookReceiver | None = None, delay_ms: int = 5
) -> str:
    """A batch of ``n`` rows that each take ``delay_ms`` upstream."""
    body: dict[str, object] = {
        "model": "gpt-4o-mini",
        "requests": rows(n, f"row {{i}} [sim:delay-ms={delay_ms}]"),
    }
    if webhooks is not None:
        body["webhookUrl"] = webhooks.url
    return str((await api.submit(body))["id"])


async def wait_progress(api: ApiClient, batch_id: str, done: int) -> None:
    """Wait until at least ``done`` rows of a running batch have an outcome."""

    async def reached() -> bool:
        batch = await api.get(batch_id)
        return batch["status"] == "running" and batch["completed"] + batch["failed"] >= done

    await wait_until(reached, 60, f"{done} rows of {batch_id} to be done")


def custom_ids(n: int) -> list[str]:
    """The custom ids :func:`tests.helpers.support.rows` gives ``n`` rows."""
    return [f"r-{i}" for i in range(n)]


async def test_sigterm_mid_batch_to_a_row_worker_and_every_service_loses_no_row(
    rsystem: System, rapi: ApiClient, http: aiohttp.ClientSession, webhooks: WebhookReceiver
) -> None:
    """Each service in turn gets SIGTERM while the batch runs: it drains, exits 0 and is
    started again; the row-worker first, whose in-flight rows must finish, not vanish."""
    batch_id = await submit(rapi, 4000, webhooks, delay_ms=10)
    done = 200
    await wait_progress(rapi, batch_id, done)
    worker = rsystem.processes["row-worker"]
    await sigterm_and_restart(worker, http)
    log = worker.log_path.read_text()
    assert '"action":"draining"' in log
    assert "tasks_handed_back" not in log, "in-flight rows were not finished within the grace"

    for name in ("dispatcher", "aggregator", "notifier", "scheduler", "ingest-api"):
        done += 100
        await wait_progress(rapi, batch_id, done)
        await sigterm_and_restart(rsystem.processes[name], http)

    await wait_terminal(rapi, batch_id, 120)
    await assert_exactly_once(rapi, rsystem.iso.database_url, batch_id, custom_ids(4000), webhooks)


async def sigterm_and_restart(proc: ServiceProcess, http: aiohttp.ClientSession) -> None:
    """SIGTERM, insist on exit 0 within the grace period, start again, wait until ready."""
    proc.signal(signal.SIGTERM)
    code = await asyncio.to_thread(proc.wait, GRACE_S + 5)
    assert code == 0, f"{proc.name} exited with {code} on SIGTERM"
    proc.start()
    await proc.wait_ready(http)


async def test_every_service_reconnects_to_the_broker(
    rsystem: System,
    rapi: ApiClient,
    http: aiohttp.ClientSession,
    proxies: tuple[TcpProxy, TcpProxy],
    webhooks: WebhookReceiver,
) -> None:
    amqp, _ = proxies
    services = services_of(rsystem)
    batch_id = await submit(rapi, 2000, webhooks)
    await wait_progress(rapi, batch_id, 100)

    closed = await close_broker_connections(rsystem.iso.namespace)
    kinds = sorted(name.rsplit("-", 1)[0] for name in closed)
    assert kinds == sorted(p.name.split("#")[0] for p in services), closed
    await wait_all_ready(services, http)

    async with amqp.outage() as cut:
        assert cut >= len(services)
        down = await wait_all_not_ready(services, http)
        assert set(down) == {p.name for p in services}
    await wait_all_ready(services, http)

    await wait_terminal(rapi, batch_id, 120)
    await assert_exactly_once(rapi, rsystem.iso.database_url, batch_id, custom_ids(2000), webhooks)


async def test_every_service_reconnects_to_the_database(
    rsystem: System,
    rapi: ApiClient,
    http: aiohttp.ClientSession,
    proxies: tuple[TcpProxy, TcpProxy],
    webhooks: WebhookReceiver,
) -> None:
    _, pg = proxies
    db_services = [p for p in services_of(rsystem) if p.name in DB_SERVICES]
    batch_id = await submit(rapi, 2000, webhooks)
    await wait_progress(rapi, batch_id, 100)

    assert await terminate_db_backends(rsystem.iso.database) > 0
    await wait_all_ready(db_services, http)

    async with pg.outage():
        await wait_all_not_ready(db_services, http)
        worker = rsystem.processes["row-worker"]
        assert await readyz(worker, http) == 200, "a row-worker does not need the database"
    await wait_all_ready(db_services, http)

    await wait_terminal(rapi, batch_id, 120)
    await assert_exactly_once(rapi, rsystem.iso.database_url, batch_id, custom_ids(2000), webhooks)


async def test_rows_lost_in_the_broker_are_published_again_after_a_stall(
    rsystem: System, rapi: ApiClient, http: aiohttp.ClientSession, webhooks: WebhookReceiver
) -> None:
    """Both row-workers stop, the queued rows vanish (a broker replaced without its
    disk), the workers come back to an empty queue: after RELAY_STALL_SECONDS (3 s here)
    without progress the dispatcher re-publishes every row without an outcome."""
    workers = [p for p in rsystem.processes.values() if p.name.startswith("row-worker")]
    batch_id = await submit(rapi, 1000, webhooks, delay_ms=10)
    await wait_progress(rapi, batch_id, 100)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert await asyncio.to_thread(worker.wait, GRACE_S + 5) == 0
    lost = await _purge_rows_queue(rsystem.iso.namespace)
    assert lost > 0, "the window should have had rows waiting in the broker"
    before = await rapi.get(batch_id)
    assert before["status"] == "running"
    for worker in workers:
        worker.start()
    for worker in workers:
        await worker.wait_ready(http)

    await wait_terminal(rapi, batch_id, 60)
    assert '"action":"job_stalled"' in rsystem.processes["dispatcher"].log_path.read_text()
    await assert_exactly_once(rapi, rsystem.iso.database_url, batch_id, custom_ids(1000), webhooks)


async def _purge_rows_queue(namespace: str) -> int:
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(Names(namespace).rows, passive=True)
        purged = await queue.purge()
        return int(purged.message_count or 0)


async def test_a_cron_template_spawns_runs_that_complete_with_their_own_webhook(
    rsystem: System, rapi: ApiClient, webhooks: WebhookReceiver
) -> None:
    template = await rapi.submit(
        {
            "name": "every minute",
            "model": "gpt-4o-mini",
            "cron": "* * * * *",
            "requests": rows(5),
            "webhookUrl": webhooks.url,
        }
    )
    assert template["status"] == "scheduled"
    assert template["next_run_at"] is not None
    # Ten minutes of ticks went by while no scheduler ran: one run, not ten.
    await _execute(
        rsystem,
        "UPDATE batches SET next_run_at = date_trunc('minute', now()) - interval '10 minutes'"
        " WHERE id = $1",
        template["id"],
    )

    async def first_run() -> dict[str, object] | None:
        status, page = await rapi.request("GET", f"/v1/batches?template_id={template['id']}")
        assert status == 200
        return page["data"][-1] if page["data"] else None

    run = await wait_until(first_run, 30, "the template's first run")
    assert run["template_id"] == template["id"]
    assert str(run["name"]).startswith("every minute @ ")
    await wait_terminal(rapi, str(run["id"]), 60)
    await assert_exactly_once(
        rapi, rsystem.iso.database_url, str(run["id"]), custom_ids(5), webhooks
    )
    assert webhooks.for_batch(template["id"]) == []

    status, canceled = await rapi.request("POST", f"/v1/batches/{template['id']}/cancel")
    assert (status, canceled["status"], canceled["next_run_at"]) == (200, "canceled", None)
    # Even forced due, a canceled template spawns nothing: a witness template forced due
    # in the same transaction proves the scheduler has looked since.
    witness = await rapi.submit({"model": "gpt-4o-mini", "cron": "* * * * *", "requests": rows(1)})
    await _execute(
        rsystem,
        "UPDATE batches SET next_run_at = now() - interval '1 minute' WHERE id = ANY($1)",
        [template["id"], witness["id"]],
    )

    async def witness_ran() -> bool:
        page = (await rapi.request("GET", f"/v1/batches?template_id={witness['id']}"))[1]
        return bool(page["data"])

    await wait_until(witness_ran, 30, "the witness template's run")
    page = (await rapi.request("GET", f"/v1/batches?template_id={template['id']}"))[1]
    assert run["id"] in {r["id"] for r in page["data"]}
    assert all(r["created_at"] <= canceled["completed_at"] for r in page["data"])
    await rapi.request("POST", f"/v1/batches/{witness['id']}/cancel")


async def _execute(system: System, sql: str, *args: object) -> None:
    conn = await asyncpg.connect(system.iso.database_url, timeout=10)
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()
