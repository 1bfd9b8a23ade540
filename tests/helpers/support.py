"""Helpers shared by the integration and e2e tiers: isolated ledger and bus, waits,
free ports, a webhook receiver and a client for the public API."""

from __future__ import annotations

import asyncio
import contextlib
import io
import random
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import asyncpg
import orjson
from aiohttp import web

from relay_batches.bus.topology import Names
from relay_batches.ids import new_id
from relay_batches.ledger.migrate import ensure_database
from relay_batches.services.relay_cli import admin

LARGE_BODY = 1 << 20  # bytes: a request body above this is sent from a buffer
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


@dataclass(frozen=True)
class Isolation:
    """One test session's own database and bus namespace."""

    database_url: str
    database: str
    namespace: str


async def create_isolation(tag: str, *, migrated: bool = True) -> Isolation:
    """A fresh database (migrated, or empty with ``migrated=False``) and a unique namespace."""
    suffix = new_id()[:10]
    database = f"relay_test_{tag}_{suffix}"
    url = f"postgresql://postgres@127.0.0.1:5432/{database}"
    if migrated:
        await admin.migrate(url)
    else:
        await ensure_database(url)
    return Isolation(url, database, f"t{tag}{suffix}")


async def drop_isolation(iso: Isolation) -> None:
    """Drop the database and every queue of the namespace."""
    conn = await asyncpg.connect(PG_ADMIN_URL, timeout=10)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{iso.database}" WITH (FORCE)')
    finally:
        await conn.close()
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        names = Names(iso.namespace)
        for queue in names.durable_queues():
            await channel.queue_delete(queue)
        await channel.exchange_delete(names.events)


async def wait_until(
    check: Callable[[], Awaitable[Any]], timeout: float, what: str, every: float = 0.1
) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(every)


# Ports handed out below the kernel's ephemeral range (32768-60999 here): a port the
# kernel picked for ``bind(0)`` is one it may also pick for any outbound connection (to
# Postgres, RabbitMQ, the services) between the pick and the service's own bind, so a
# service started on it now and then failed to bind and exited 1.
_PORTS_LOW, _PORTS_HIGH = 20_000, 32_000
_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port that is free on loopback right now, outside the ephemeral range and
    never handed out before by this process."""
    while True:
        port = random.randrange(_PORTS_LOW, _PORTS_HIGH)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port


@dataclass
class WebhookReceiver:
    """A local HTTP server that records every POST body it receives."""

    port: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """Where to send webhooks."""
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> None:
        """Listen on a free port."""

        async def hook(request: web.Request) -> web.Response:
            self.bodies.append(orjson.loads(await request.read()))
            self.headers.append(dict(request.headers))
            return web.Response(status=204)

        app = web.Application()
        app.router.add_post("/hook", hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> WebhookReceiver:
        """Listening, until the block ends."""
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stop listening."""
        await self.stop()

    def for_batch(self, batch_id: str) -> list[dict[str, Any]]:
        """The bodies received for ``batch_id``."""
        return [b for b in self.bodies if b.get("id") == batch_id]


class ApiClient:
    """A thin client of the public API, as a user's script would write it."""

    def __init__(self, base_url: str, key: str, session: aiohttp.ClientSession) -> None:
        self.base_url = base_url
        self.key = key
        self._session = session

    def _headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    async def request(
        self, method: str, path: str, *, json: Any = None, key: str | None = None, **kw: Any
    ) -> tuple[int, Any]:
        """Send one request; return (status, decoded JSON body)."""
        headers = {**self._headers(key), **kw.pop("headers", {})}
        if json is not None:
            data = orjson.dumps(json)
            # aiohttp warns (an error here) about a large body as raw bytes.
            kw["data"] = io.BytesIO(data) if len(data) > LARGE_BODY else data
            headers.setdefault("Content-Type", "application/json")
        async with self._session.request(
            method, self.base_url + path, headers=headers, timeout=aiohttp.ClientTimeout(60), **kw
        ) as response:
            raw = await response.read()
            return response.status, orjson.loads(raw) if raw else None

    async def submit(self, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
        """POST a batch and insist on 201."""
        status, data = await self.request("POST", "/v1/batches", json=body, key=key)
        assert status == 201, (status, data)
        return data

    async def get(self, batch_id: str) -> dict[str, Any]:
        """GET a batch and insist on 200."""
        status, data = await self.request("GET", f"/v1/batches/{batch_id}")
        assert status == 200, (status, data)
        return data

    async def wait_status(
        self, batch_id: str, statuses: set[str], timeout: float
    ) -> dict[str, Any]:
        """Poll until the batch reaches one of ``statuses``."""

        async def reached() -> dict[str, Any] | None:
            batch = await self.get(batch_id)
            return batch if batch["status"] in statuses else None

        return await wait_until(reached, timeout, f"batch {batch_id} to reach {statuses}", 0.2)

    async def results(self, batch_id: str) -> dict[str, Any]:
        """GET the results document and insist on 200."""
        status, data = await self.request("GET", f"/v1/batches/{batch_id}/results")
        assert status == 200, (status, data)
        return data


def rows(n: int, template: str = "row {i}") -> list[dict[str, Any]]:
    """``n`` single-message requests with custom ids ``r-0``…"""
    return [
        {"custom_id": f"r-{i}", "messages": [{"role": "user", "content": template.format(i=i)}]}
        for i in range(n)
    ]


async def past_redelivery_cooldown(database_url: str, batch_id: str) -> None:
    """Date a batch's last webhook attempt's end back past the redelivery cooldown (10 s),
    so a test asks for a redelivery at once rather than waiting it out."""
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        await conn.execute(
            "UPDATE webhook_deliveries SET finished_at = now() - interval '11s'"
            " WHERE batch_id = $1",
            batch_id,
        )
    finally:
        await conn.close()


RELAY_CLI = Path(sys.executable).parent / "relay"


async def relay_admin(iso: Isolation, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``relay`` CLI's admin commands against ``iso``'s database, in a thread (the
    event loop keeps serving the test's servers meanwhile)."""
    return await asyncio.to_thread(
        subprocess.run,
        [str(RELAY_CLI), *args],
        env={"RELAY_DATABASE_URL": iso.database_url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@contextlib.asynccontextmanager
async def watching(names: Names, *keys: str) -> AsyncIterator[aio_pika.abc.AbstractQueue]:
    """An exclusive queue bound to the events exchange of ``names`` under each of ``keys``,
    on a connection of its own closed on leaving (the queue's ``channel`` stays usable)."""
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        events = await channel.get_exchange(names.events)
        queue = await channel.declare_queue("", exclusive=True)
        for key in keys:
            await queue.bind(events, key)
        yield queue


async def rows_queue_depth(namespace: str) -> int:
    """Task messages waiting in the rows queue of ``namespace``."""
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(Names(namespace).rows, passive=True)
        return int(queue.declaration_result.message_count or 0)


RELAY = str(Path(sys.executable).parent / "relay")


async def run_relay(*args: str, env: dict[str, str], timeout_s: float) -> tuple[int, bytes, bytes]:
    """Run ``relay ARGS`` with ``env`` and no stdin; its exit code, stdout and stderr. Past
    ``timeout_s`` the process is killed and the timeout raised."""
    process = await asyncio.create_subprocess_exec(
        RELAY,
        *args,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out, err


async def rows_naming(pool: asyncpg.Pool, batch_id: str) -> dict[str, int]:
    """How many rows of each table name ``batch_id`` (``keys``: stored idempotent answers
    that mention it)."""
    row = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM batches WHERE id = $1) AS batches,"
        " (SELECT count(*) FROM batch_rows WHERE batch_id = $1) AS batch_rows,"
        " (SELECT count(*) FROM row_results WHERE batch_id = $1) AS row_results,"
        " (SELECT count(*) FROM webhook_deliveries WHERE batch_id = $1) AS deliveries,"
        " (SELECT count(*) FROM webhook_attempts WHERE batch_id = $1) AS attempts,"
        " (SELECT count(*) FROM idempotency_keys WHERE strpos(response_body, $1) > 0) AS keys",
        batch_id,
    )
    assert row is not None
    return dict(row)


async def expire_delivery_claim(pool: asyncpg.Pool, batch_id: str) -> None:
    """Make the current claim of ``batch_id``'s webhook delivery look like its holder went
    silent long ago."""
    await pool.execute(
        "UPDATE webhook_deliveries SET claim_expires_at = now() - interval '1s'"
        " WHERE batch_id = $1",
        batch_id,
    )


async def drop_names(names: Names) -> None:
    """Delete the durable queues and the events exchange of ``names``."""
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        for queue in names.durable_queues():
            await channel.queue_delete(queue)
        await channel.exchange_delete(names.events)
