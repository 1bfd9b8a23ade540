"""The two server faults of the full chaos run, in two modes.

``restart`` (what ``make chaos`` uses) really restarts RabbitMQ and Postgres with a shell
command each (``RELAY_CHAOS_RABBITMQ_RESTART`` and ``RELAY_CHAOS_POSTGRES_RESTART``,
defaults :data:`RABBITMQ_RESTART` and :data:`POSTGRES_RESTART`):
every other user of those servers is disrupted too, so it must only run on a machine
nobody else is testing on.

``sever`` does to one system what a restart does to its clients, and nothing to anyone
else: the server closes the system's connections (``rabbitmqctl close_connection`` of
its namespace; ``pg_terminate_backend`` of its database), and the proxies the system
connects through refuse new connections until every affected service reports not
ready.
"""

from __future__ import annotations

import asyncio
import os

import aio_pika
import aiohttp
import asyncpg
from aio_pika.exceptions import CONNECTION_EXCEPTIONS

from tests.chaos.driver import ServerFault
from tests.helpers.checks import services_of, wait_all_not_ready
from tests.helpers.faults import TcpProxy, close_broker_connections, terminate_db_backends
from tests.helpers.processes import System
from tests.helpers.support import AMQP_URL, PG_ADMIN_URL, wait_until

RESTART_TIMEOUT_S = 180
# A server stopped for a while (``outage``): the stop and start commands of a restart.
RABBITMQ_STOP = "rabbitmqctl -q shutdown"
RABBITMQ_START = "rabbitmq-server -detached"
PG_CLUSTER = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | head -n 1) main"
DB_SERVICES = ("ingest-api", "scheduler", "dispatcher", "aggregator", "notifier", "offloader")


async def run_shell(command: str) -> None:
    """Run ``command`` through the shell; fail with its output if it fails."""
    process = await asyncio.create_subprocess_shell(
        command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), RESTART_TIMEOUT_S)
    if process.returncode != 0:
        raise AssertionError(f"{command!r} failed ({process.returncode}): {out.decode()}")


async def _amqp_up() -> bool:
    try:
        connection = await aio_pika.connect(AMQP_URL, timeout=5)
    except (*CONNECTION_EXCEPTIONS, TimeoutError):
        return False
    await connection.close()
    return True


async def _postgres_up() -> bool:
    try:
        conn = await asyncpg.connect(PG_ADMIN_URL, timeout=5)
    except (OSError, asyncpg.PostgresError):
        return False
    await conn.close()
    return True


# How this kind of machine runs the servers (as .ci/run starts them): `service … restart`
# hung for minutes against a broker started with `rabbitmq-server -detached`. The test
# waits for each server to accept connections again after its command returns.
RABBITMQ_RESTART = "rabbitmqctl -q shutdown; rabbitmq-server -detached"
POSTGRES_RESTART = (
    "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | head -n 1) main restart"
)


def restart_faults() -> list[tuple[str, ServerFault]]:
    """Real restarts of RabbitMQ, then Postgres."""

    async def rabbitmq() -> str:
        command = os.environ.get("RELAY_CHAOS_RABBITMQ_RESTART", RABBITMQ_RESTART)
        await run_shell(command)
        await wait_until(_amqp_up, RESTART_TIMEOUT_S, "RabbitMQ to accept connections", 0.5)
        return f"ran {command!r}"

    async def postgres() -> str:
        command = os.environ.get("RELAY_CHAOS_POSTGRES_RESTART", POSTGRES_RESTART)
        await run_shell(command)
        await wait_until(_postgres_up, RESTART_TIMEOUT_S, "Postgres to accept connections", 0.5)
        return f"ran {command!r}"

    return [("rabbitmq", rabbitmq), ("postgres", postgres)]


def sever_faults(
    system: System, amqp: TcpProxy, pg: TcpProxy, http: aiohttp.ClientSession
) -> list[tuple[str, ServerFault]]:
    """RabbitMQ, then Postgres, dropping and refusing only ``system``'s connections."""
    services = services_of(system)
    db_services = [p for p in services if p.name in DB_SERVICES]

    async def rabbitmq() -> str:
        closed = await close_broker_connections(system.iso.namespace)
        async with amqp.outage() as cut:
            await wait_all_not_ready(services, http)
        return f"broker closed {len(closed)} connections, proxy cut {cut}; all not ready"

    async def postgres() -> str:
        ended = await terminate_db_backends(system.iso.database)
        async with pg.outage() as cut:
            await wait_all_not_ready(db_services, http)
        return f"terminated {ended} backends, proxy cut {cut}; all not ready"

    return [("rabbitmq", rabbitmq), ("postgres", postgres)]


def outage_fault(
    target: str, seconds: float, mode: str, system: System, amqp: TcpProxy, pg: TcpProxy
) -> ServerFault:
    """``target`` (``rabbitmq`` or ``postgres``) away for ``seconds``: really stopped and
    started again (``restart``: everyone's server), or only ``system``'s connections cut
    and refused meanwhile (``sever``)."""
    up = _amqp_up if target == "rabbitmq" else _postgres_up
    stop, start = (
        (RABBITMQ_STOP, RABBITMQ_START)
        if target == "rabbitmq"
        else (f"{PG_CLUSTER} stop", f"{PG_CLUSTER} start")
    )

    async def restart() -> str:
        await run_shell(stop)
        await asyncio.sleep(seconds)
        await run_shell(start)
        await wait_until(up, RESTART_TIMEOUT_S, f"{target} to accept connections", 0.5)
        return f"stopped {seconds:g} s: {stop!r}, then {start!r}"

    async def sever() -> str:
        proxy = amqp if target == "rabbitmq" else pg
        async with proxy.outage() as cut:
            if target == "rabbitmq":
                await close_broker_connections(system.iso.namespace)
            else:
                await terminate_db_backends(system.iso.database)
            await asyncio.sleep(seconds)
        return f"proxy cut {cut} connections and refused new ones for {seconds:g} s"

    return restart if mode == "restart" else sever
