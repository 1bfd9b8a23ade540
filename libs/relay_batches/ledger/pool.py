"""The asyncpg pool and the boundary that turns driver errors into Relay errors."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from relay_batches.errors import PermanentError, TransientError
from relay_batches.reach import DATABASE, reaching

# A connection of our own or one acquired from a pool: ledger helpers take either.
Connection: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"

COMMAND_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 2.0

# Data the database will never accept, however often it is retried.
_PERMANENT = (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError)

_TRANSIENT = (
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    # admin_shutdown / crash_shutdown / query_canceled: a restart or a terminated backend.
    asyncpg.OperatorInterventionError,
    asyncpg.TooManyConnectionsError,
    asyncpg.InterfaceError,
    asyncpg.SerializationError,
    asyncpg.DeadlockDetectedError,
    asyncpg.LockNotAvailableError,
    ConnectionError,
    OSError,
    TimeoutError,
)


async def create_pool(
    database_url: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    statement_cache_size: int = 100,
    max_inactive_s: float = 300.0,
) -> asyncpg.Pool:
    """Open a pool with bounded connect and command timeouts (``statement_cache_size=0``
    behind a transaction-mode PgBouncer older than 1.21); a connection idle for
    ``max_inactive_s`` is closed. :class:`~relay_batches.reach.Unreachable` when the
    database cannot be reached (or refuses the connection)."""
    async with reaching(DATABASE, database_url):
        pool = await _open(database_url, min_size, max_size, statement_cache_size, max_inactive_s)
    assert pool is not None
    return pool


async def _open(
    database_url: str,
    min_size: int,
    max_size: int,
    statement_cache_size: int,
    max_inactive_s: float,
) -> asyncpg.Pool | None:
    return await asyncpg.create_pool(
        database_url,
        min_size=min_size,
        max_size=max_size,
        max_inactive_connection_lifetime=max_inactive_s,
        timeout=CONNECT_TIMEOUT_S,
        command_timeout=COMMAND_TIMEOUT_S,
        statement_cache_size=statement_cache_size,
    )


@contextlib.asynccontextmanager
async def translated() -> AsyncIterator[None]:
    """Raise :class:`TransientError` for connection-level failures of the driver and
    :class:`PermanentError` for data the database refuses (NUL in text, out of range)."""
    try:
        yield
    except _TRANSIENT as exc:
        raise TransientError(f"database unavailable: {exc!r}") from exc
    except _PERMANENT as exc:
        raise PermanentError(f"database refused the data: {exc!r}") from exc


async def database_ready(pool: asyncpg.Pool) -> bool:
    """Cheap liveness check of the database behind ``pool`` (False, never an error)."""
    try:
        async with translated():
            # Bounds the acquire (a reconnect) as well as the query.
            await asyncio.wait_for(pool.fetchval("SELECT 1"), READY_TIMEOUT_S)
        return True
    except (TransientError, asyncpg.PostgresError):
        # e.g. the database refusing connections for a while (ALLOW_CONNECTIONS false).
        return False
