"""Numbered SQL migrations, applied once each under an advisory lock.

Safe to run from several processes at once: one advisory lock serialises creating the
database, another applying migrations, and the ``schema_migrations`` table makes each
file apply exactly once.
"""

from __future__ import annotations

from importlib import resources

import asyncpg

MIGRATION_LOCK_KEY = 0x52454C4159  # "RELAY"
# Taken in the admin database while creating the ledger database (released on close).
CREATE_LOCK_KEY = 0x52454C4143  # "RELAC"


def migration_files() -> list[tuple[str, str]]:
    """Every migration as ``(name, sql)``, in numeric order."""
    folder = resources.files("relay_batches.ledger") / "migrations"
    found = [(p.name, p.read_text(encoding="utf-8")) for p in folder.iterdir()]
    return sorted((name, sql) for name, sql in found if name.endswith(".sql"))


async def apply_migrations(conn: asyncpg.Connection) -> list[str]:
    """Apply the migrations not yet recorded; return the names applied now."""
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
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_migrations (name) VALUES ($1)", name)
            applied_now.append(name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
    return applied_now


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
