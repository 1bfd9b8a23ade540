"""The unreleased migrations that scan a large table (webhook_deliveries from 0006,
batches from 0010, batch_rows from 0024: all only grow) do so without an ACCESS
EXCLUSIVE lock on it or on the tables changed alongside, and the status CHECKs end up
validated. The released ones
(0003, 0005) ran long ago and are left as they are."""

from __future__ import annotations

import re

import asyncpg

from relay_batches.ledger.migrate import migration_files
from relay_batches.ledger.schema import migration_version
from tests.helpers.support import create_isolation, drop_isolation

# Each large table: the first unreleased migration that may scan it, and its CHECK.
LARGE = {
    "webhook_deliveries": (6, "webhook_deliveries_status_check"),
    "batches": (10, "batches_status_check"),
    "batch_rows": (24, None),  # 0025 fills the model of the rows stored before (no CHECK)
}
# Tables whose ACCESS EXCLUSIVE lock stops every job's work (read by every service).
GUARDED = ("webhook_deliveries", "batches", "batch_rows")


def _scans(table: str) -> re.Pattern[str]:
    """Statements that read every row of ``table``: building an index on it, adding a
    CHECK that is validated at once (without NOT VALID) or validating one, or updating
    its rows."""
    return re.compile(
        rf"CREATE\s+INDEX[^;]*\bON\s+{table}\b"
        rf"|ALTER\s+TABLE\s+{table}\s+VALIDATE\s+CONSTRAINT"
        rf"|UPDATE\s+{table}\b"
        rf"|ALTER\s+TABLE\s+{table}\s+ADD\s+CONSTRAINT\s+\w+\s+CHECK\s*\((?:(?!NOT\s+VALID)[^;])*;",
        re.I,
    )


def _code(sql: str) -> str:
    return "\n".join(line.split("--")[0] for line in sql.splitlines())


def _scanned(name: str, sql: str) -> list[str]:
    return [
        table
        for table, (first, _) in LARGE.items()
        if migration_version(name) >= first and _scans(table).search(_code(sql) + ";")
    ]


async def test_scans_of_large_tables_never_hold_an_exclusive_lock() -> None:
    iso = await create_isolation("miglocks", migrated=False)
    conn = await asyncpg.connect(iso.database_url, timeout=10)
    try:
        await conn.execute(
            "CREATE TABLE schema_migrations (name text PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        scanning: dict[str, dict[str, set[str]]] = {}
        for name, sql in migration_files():
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_migrations (name) VALUES ($1)", name)
                if _scanned(name, sql):
                    held = await conn.fetch(
                        "SELECT relation::regclass::text AS rel, mode FROM pg_locks"
                        " WHERE pid = pg_backend_pid() AND relation = ANY("
                        " SELECT to_regclass(t) FROM unnest($1::text[]) AS t)",
                        list(GUARDED),
                    )
                    scanning[name] = {}
                    for r in held:
                        scanning[name].setdefault(r["rel"], set()).add(r["mode"])
        scanned = {table for name, sql in migration_files() for table in _scanned(name, sql)}
        assert scanned == set(LARGE), "a large table is never scanned: the check is stale"
        # Held until the migration's commit: an ACCESS EXCLUSIVE lock there would stop
        # every reader of the table for the whole scan.
        exclusive = {
            (name, rel)
            for name, locks in scanning.items()
            for rel, modes in locks.items()
            if "AccessExclusiveLock" in modes
        }
        assert exclusive == set()
        for _, check in LARGE.values():
            if check is None:
                continue
            assert await conn.fetchval(
                "SELECT convalidated FROM pg_constraint WHERE conname = $1", check
            ), check
    finally:
        await conn.close()
        await drop_isolation(iso)
