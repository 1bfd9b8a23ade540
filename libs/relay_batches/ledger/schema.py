"""Whether the ledger's schema is at the version this code expects.

The expected version is the highest number among the migration files shipped with the
code (``0004_security.sql`` → 4); the database's version is the highest number recorded
in ``schema_migrations`` (0 while that table does not exist). A database ahead of the
code (a newer release migrated it first) counts as current.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import asyncpg

from relay_batches.errors import TransientError
from relay_batches.ledger.migrate import migration_files
from relay_batches.ledger.pool import READY_TIMEOUT_S, database_ready, translated

RECHECK_S = 1.0

APPLIED_VERSION_SQL = """
SELECT coalesce(max(split_part(name, '_', 1)::int), 0)
FROM schema_migrations
WHERE name ~ '^[0-9]+_'
"""


def migration_version(name: str) -> int:
    """The number a migration file name starts with (``0004_security.sql`` → 4)."""
    return int(name.split("_", 1)[0])


def expected_version() -> int:
    """The highest migration number shipped with this code."""
    return max((migration_version(name) for name, _ in migration_files()), default=0)


async def applied_version(pool: asyncpg.Pool) -> int:
    """The highest migration number recorded in the database (0 if none ran yet)."""
    try:
        async with translated():
            value = await asyncio.wait_for(pool.fetchval(APPLIED_VERSION_SQL), READY_TIMEOUT_S)
    except asyncpg.UndefinedTableError:
        return 0
    return int(value)


class SchemaGate:
    """Answers "is the schema current?"; once it is, the answer is cached for good.

    While the schema is behind, the version is read again at most every ``recheck_s``
    (requests and probes arriving in between get the last answer), so a pending
    migration costs one cheap query per interval, not one per request.
    """

    def __init__(
        self,
        read_version: Callable[[], Awaitable[int]],
        expected: int,
        recheck_s: float = RECHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_version = read_version
        self._expected = expected
        self._recheck_s = recheck_s
        self._clock = clock
        self._current = False
        self._checked_at: float | None = None

    @property
    def expected(self) -> int:
        """The version this code expects."""
        return self._expected

    async def current(self) -> bool:
        """True once the database's schema is at (or past) the expected version."""
        if self._current:
            return True
        now = self._clock()
        if self._checked_at is not None and now - self._checked_at < self._recheck_s:
            return False
        self._checked_at = now
        try:
            self._current = await self._read_version() >= self._expected
        except (TransientError, asyncpg.PostgresError):
            return False
        return self._current


def schema_gate(pool: asyncpg.Pool) -> SchemaGate:
    """A gate on the schema of the database behind ``pool``, expecting this code's version."""
    return SchemaGate(lambda: applied_version(pool), expected_version())


def ledger_readiness(
    pool: asyncpg.Pool, gate: SchemaGate | None = None
) -> Callable[[], Awaitable[bool]]:
    """The ledger part of a service's readiness: reachable, and its schema current."""
    gate = gate or schema_gate(pool)

    async def ready() -> bool:
        return await database_ready(pool) and await gate.current()

    return ready
