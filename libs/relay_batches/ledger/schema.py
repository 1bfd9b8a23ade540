"""Whether the ledger's schema is at the version this code expects.

The schema is current when every migration file shipped with the code is recorded in
``schema_migrations`` (none is while that table does not exist). The sets are compared,
not the highest numbers: a database that has a later migration but misses an earlier
one (branches merged in another order than they were numbered) is not current. Names
recorded that this code does not ship (a newer release migrated it first) are ignored.
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

APPLIED_NAMES_SQL = "SELECT name FROM schema_migrations"


def migration_version(name: str) -> int:
    """The number a migration file name starts with (``0004_security.sql`` → 4)."""
    return int(name.split("_", 1)[0])


def expected_migrations() -> frozenset[str]:
    """The names of the migration files shipped with this code."""
    return frozenset(name for name, _ in migration_files())


async def applied_migrations(pool: asyncpg.Pool) -> frozenset[str]:
    """The migration names recorded in the database (none if none ran yet)."""
    try:
        async with translated():
            records = await asyncio.wait_for(pool.fetch(APPLIED_NAMES_SQL), READY_TIMEOUT_S)
    except asyncpg.UndefinedTableError:
        return frozenset()
    return frozenset(r[0] for r in records)


class SchemaGate:
    """Answers "is the schema current?"; once it is, the answer is cached for good.

    While the schema is behind, the recorded migrations are read again at most every ``recheck_s``
    (requests and probes arriving in between get the last answer), so a pending
    migration costs one cheap query per interval, not one per request.
    """

    def __init__(
        self,
        read_applied: Callable[[], Awaitable[frozenset[str]]],
        expected: frozenset[str],
        recheck_s: float = RECHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_applied = read_applied
        self._expected = expected
        self._recheck_s = recheck_s
        self._clock = clock
        self._current = False
        self._checked_at: float | None = None

    @property
    def expected(self) -> frozenset[str]:
        """The migrations this code expects recorded."""
        return self._expected

    async def current(self) -> bool:
        """True once every expected migration is recorded in the database."""
        if self._current:
            return True
        now = self._clock()
        if self._checked_at is not None and now - self._checked_at < self._recheck_s:
            return False
        self._checked_at = now
        try:
            self._current = self._expected <= await self._read_applied()
        except (TransientError, asyncpg.PostgresError):
            return False
        return self._current


def schema_gate(pool: asyncpg.Pool) -> SchemaGate:
    """A gate on the schema of the database behind ``pool``, expecting this code's
    migrations."""
    return SchemaGate(lambda: applied_migrations(pool), expected_migrations())


def ledger_readiness(
    pool: asyncpg.Pool, gate: SchemaGate | None = None
) -> Callable[[], Awaitable[bool]]:
    """The ledger part of a service's readiness: reachable, and its schema current."""
    gate = gate or schema_gate(pool)

    async def ready() -> bool:
        return await database_ready(pool) and await gate.current()

    return ready
