"""Faults for recovery tests that touch only this test's own system, never the servers.

Other test runs share the Postgres and RabbitMQ servers, so nothing here restarts them:

- :class:`TcpProxy` sits between one system's services and a server; ``outage()`` cuts
  every connection through it and refuses new ones until the outage ends, which is what
  a server restart looks like from the services' side;
- :func:`close_broker_connections` has RabbitMQ itself close one namespace's
  connections (``CONNECTION_FORCED``, as a broker shutting down does);
- :func:`terminate_db_backends` ends one database's backends (``admin_shutdown``, as a
  Postgres restart does).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg

from tests.helpers.support import PG_ADMIN_URL

RABBITMQCTL_TIMEOUT_S = 60
PIPE_CHUNK = 65536


class TcpProxy:
    """A loopback TCP proxy to ``host:port`` that can simulate the server going away."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.target_port = port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._refusing = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.accepted = 0

    async def start(self) -> None:
        """Listen on a free loopback port."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and cut every connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self.sever()
        if self._tasks:  # aborted transports end every pipe; no task is cancelled
            await asyncio.wait(set(self._tasks), timeout=10)

    def sever(self) -> int:
        """Abort every proxied connection (both sides); return how many were cut."""
        writers, self._writers = self._writers, set()
        for writer in writers:
            writer.transport.abort()
        return len(writers) // 2

    @contextlib.asynccontextmanager
    async def outage(self) -> AsyncIterator[int]:
        """Cut every connection and refuse new ones until the block exits."""
        self._refusing = True
        try:
            yield self.sever()
        finally:
            self._refusing = False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.target_port), 10
            )
        except (OSError, TimeoutError):
            writer.transport.abort()
            return
        self.accepted += 1
        self._writers.update((writer, up_writer))
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._tasks.discard(task)
            for end in (writer, up_writer):
                self._writers.discard(end)
                end.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(PIPE_CHUNK):
            writer.write(chunk)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.transport.abort()


async def rabbitmqctl(*args: str) -> str:
    """Run ``rabbitmqctl`` without blocking the event loop; its stdout, or an error."""
    process = await asyncio.create_subprocess_exec(
        "rabbitmqctl",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), RABBITMQCTL_TIMEOUT_S)
    if process.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {err.decode(errors='replace')}")
    return out.decode(errors="replace")


async def broker_connections(namespace: str) -> list[tuple[str, str]]:
    """``(pid, connection_name)`` of every broker connection of ``namespace``."""
    out = await rabbitmqctl(
        "list_connections", "-q", "--no-table-headers", "pid", "client_properties"
    )
    found = []
    marker = f'{{"relay_namespace","{namespace}"}}'
    for line in out.splitlines():
        pid, _, properties = line.partition("\t")
        if marker in properties:
            name = properties.split('{"connection_name","', 1)[1].split('"', 1)[0]
            found.append((pid, name))
    return found


async def close_broker_connections(namespace: str) -> list[str]:
    """Have RabbitMQ close every connection of ``namespace``; return their names."""
    found = await broker_connections(namespace)
    await asyncio.gather(
        *(rabbitmqctl("close_connection", pid, "relay recovery test") for pid, _ in found)
    )
    return [name for _, name in found]


async def terminate_db_backends(database: str) -> int:
    """End every backend connected to ``database`` (not others); return how many."""
    conn = await asyncpg.connect(PG_ADMIN_URL, timeout=10)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                " FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                database,
            )
        )
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def server_proxies() -> AsyncIterator[tuple[TcpProxy, TcpProxy]]:
    """A started proxy in front of RabbitMQ and one in front of Postgres, stopped on leaving."""
    amqp, pg = TcpProxy("127.0.0.1", 5672), TcpProxy("127.0.0.1", 5432)
    await amqp.start()
    await pg.start()
    try:
        yield amqp, pg
    finally:
        await amqp.stop()
        await pg.stop()
