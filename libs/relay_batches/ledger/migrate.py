"""Numbered SQL migrations, applied once each under an advisory lock.

Safe to run from several processes at once: one advisory lock serialises creating the
database, another applying migrations, and the ``schema_migrations`` table makes each
file apply exactly once.

Each migration runs in its own transaction with ``SET LOCAL lock_timeout``: a table lock
it cannot take at once (a long transaction on ``batches`` holds a conflicting one) fails
after the timeout instead of queueing, because a queued ACCESS EXCLUSIVE request makes
every later query of that table queue behind it and stalls the ledger. The migration is
rolled back and tried again after a growing wait, a bounded number of times, each retry
logged with what holds the lock; the last failure raises :class:`MigrationLockError`
naming the migration and the holders. Every file runs in a transaction, so none may use
``CREATE INDEX CONCURRENTLY`` (the migrations say so where they build indexes).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from importlib import resources

import asyncpg

MIGRATION_LOCK_KEY = 0x52454C4159  # "RELAY"
# Taken in the admin database while creating the ledger database (released on close).
CREATE_LOCK_KEY = 0x52454C4143  # "RELAC"

_log = logging.getLogger("relay.migrate")

# Other sessions of this database holding a lock on a table the migration names: the
# likely holders of what it could not take (the wait itself ended with the timeout).
_HOLDERS_SQL = """
SELECT a.pid, a.usename, a.application_name, a.state,
       extract(epoch FROM now() - a.xact_start)::int AS xact_age_s,
       left(a.query, 120) AS query,
       string_agg(DISTINCT c.relname || ' ' || l.mode, ', ') AS locks
FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND c.relkind IN ('r', 'p') AND $1 ~* ('\\m' || c.relname || '\\M')
GROUP BY a.pid, a.usename, a.application_name, a.state, a.xact_start, a.query
ORDER BY a.xact_start NULLS LAST
LIMIT 5
"""


@dataclass(frozen=True)
class LockRetry:
    """How a migration waits for its table locks: ``lock_timeout_s`` per try, ``tries``
    tries, and between them a wait from ``first_wait_s`` doubling up to ``max_wait_s``.

    The defaults give up after about 100 s (12 × 5 s of waiting on locks, 42.5 s between).
    """

    lock_timeout_s: float = 5.0
    tries: int = 12
    first_wait_s: float = 0.5
    max_wait_s: float = 5.0

    def wait_s(self, attempt: int) -> float:
        """The pause after failed try ``attempt`` (1-based)."""
        return float(min(self.max_wait_s, self.first_wait_s * 2 ** (attempt - 1)))


class MigrationLockError(Exception):
    """A migration could not take its table locks within every try."""


def migration_files() -> list[tuple[str, str]]:
    """Every migration as ``(name, sql)``, in numeric order."""
    folder = resources.files("relay_batches.ledger") / "migrations"
    found = [(p.name, p.read_text(encoding="utf-8")) for p in folder.iterdir()]
    return sorted((name, sql) for name, sql in found if name.endswith(".sql"))


async def apply_migrations(conn: asyncpg.Connection, retry: LockRetry | None = None) -> list[str]:
    """Apply the migrations not yet recorded; return the names applied now.

    Raises :class:`MigrationLockError` when one cannot take its locks (see the module).
    """
    policy = retry or LockRetry()
    applied_now: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations")}
        for name, sql in migration_files():
            if name in done:
                continue
            await _apply_with_retries(conn, name, sql, policy)
            applied_now.append(name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    return applied_now


async def _apply_with_retries(
    conn: asyncpg.Connection, name: str, sql: str, policy: LockRetry
) -> None:
    for attempt in range(1, policy.tries + 1):
        try:
            await _apply_one(conn, name, sql, policy.lock_timeout_s)
            return
        except asyncpg.LockNotAvailableError:
            holders = await lock_holders(conn, sql)
            if attempt == policy.tries:
                raise MigrationLockError(
                    f"migration {name} could not take its table locks in {policy.tries}"
                    f" tries of {policy.lock_timeout_s:g} s (lock_timeout); held by:"
                    f" {holders}"
                ) from None
            wait_s = policy.wait_s(attempt)
            _log.warning(
                "migration_lock_retry",
                extra={
                    "migration": name,
                    "attempt": attempt,
                    "tries": policy.tries,
                    "retry_in_s": wait_s,
                    "held_by": holders,
                },
            )
            await asyncio.sleep(wait_s)


async def _apply_one(conn: asyncpg.Connection, name: str, sql: str, timeout_s: float) -> None:
    async with conn.transaction():
        # SET LOCAL takes no bind parameters; the value is our own float, in ms.
        await conn.execute(f"SET LOCAL lock_timeout = '{max(1, int(timeout_s * 1000))}ms'")
        await conn.execute(sql)
        await conn.execute("INSERT INTO schema_migrations (name) VALUES ($1)", name)


async def lock_holders(conn: asyncpg.Connection, sql: str) -> str:
    """Who holds locks on the tables ``sql`` names, oldest transaction first, one phrase
    each (``pid 42 (relay, 'idle in transaction', transaction 31 s): batches
    AccessShareLock; query: …``); ``unknown`` when none is found any more."""
    rows = await conn.fetch(_HOLDERS_SQL, sql)
    if not rows:
        return "unknown (no other session holds a lock on its tables now)"
    return "; ".join(
        f"pid {r['pid']} ({r['usename']}"
        + (f" {r['application_name']}" if r["application_name"] else "")
        + f", {r['state']!r}, transaction {r['xact_age_s']} s): {r['locks']};"
        f" query: {r['query']!r}"
        for r in rows
    )


async def ensure_database(database_url: str) -> bool:
    """Create the database named in ``database_url`` if it is missing; True if created."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(database_url)
    dbname = parts.path.lstrip("/")
    if not dbname:
        return False
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        # Serialise first runs: two concurrent CREATE DATABASE of one name race on the
        # catalogue (a UniqueViolationError, not DuplicateDatabaseError, for the loser).
        await conn.execute("SELECT pg_advisory_lock($1)", CREATE_LOCK_KEY)
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", dbname)
        if exists:
            return False
        quoted = '"' + dbname.replace('"', '""') + '"'
        try:
            await conn.execute(f"CREATE DATABASE {quoted}")
        except (asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
            # Created meanwhile by a runner that does not take the lock.
            return False
        return True
    finally:
        await conn.close()
