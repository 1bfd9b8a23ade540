"""The unreleased migrations (0006 on) that scan webhook_deliveries (which only grows) do
so without a lock that stops its readers, and the status CHECK ends up validated. The
released ones (0003, 0005) ran long ago and are left as they are."""

from __future__ import annotations

import re

import asyncpg

from relay_batches.ledger.migrate import migration_files
from relay_batches.ledger.schema import migration_version
from tests.helpers.support import create_isolation, drop_isolation

FIRST_UNRELEASED = 6

# Statements that read every row of webhook_deliveries: building an index on it, or
# adding a CHECK that is validated at once (without NOT VALID) or validating one.
_SCANS = re.compile(
    r"CREATE\s+INDEX[^;]*\bON\s+webhook_deliveries\b"
    r"|ALTER\s+TABLE\s+webhook_deliveries\s+VALIDATE\s+CONSTRAINT"
    r"|ALTER\s+TABLE\s+webhook_deliveries\s+ADD\s+CONSTRAINT\s+\w+\s+CHECK\s*\((?:(?!NOT\s+VALID)[^;])*;",
    re.I,
)


def _code(sql: str) -> str:
    return "\n".join(line.split("--")[0] for line in sql.splitlines())


async def test_scans_of_webhook_deliveries_never_hold_an_exclusive_lock() -> None:
    iso = await create_isolation("miglocks", migrated=False)
    conn = await asyncpg.connect(iso.database_url, timeout=10)
    try:
        await conn.execute(
            "CREATE TABLE schema_migrations (name text PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        scanning: dict[str, set[str]] = {}
        for name, sql in migration_files():
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_migrations (name) VALUES ($1)", name)
                if migration_version(name) >= FIRST_UNRELEASED and _SCANS.search(_code(sql) + ";"):
                    held = await conn.fetch(
                        "SELECT mode FROM pg_locks WHERE pid = pg_backend_pid()"
                        " AND relation = 'webhook_deliveries'::regclass"
                    )
                    scanning[name] = {r["mode"] for r in held}
        assert scanning, "no migration scans webhook_deliveries"
        # Held until the migration's commit: an ACCESS EXCLUSIVE lock there would stop
        # every reader of the table for the whole scan.
        assert {n: m for n, m in scanning.items() if "AccessExclusiveLock" in m} == {}
        assert await conn.fetchval(
            "SELECT convalidated FROM pg_constraint"
            " WHERE conname = 'webhook_deliveries_status_check'"
        )
    finally:
        await conn.close()
        await drop_isolation(iso)
