"""``relay migrate`` as several pods run it at once, on a database nobody created yet."""

from __future__ import annotations

import asyncio
import os

import asyncpg

from relay_batches.ids import new_id
from relay_batches.ledger.migrate import migration_files
from tests.helpers.support import PG_ADMIN_URL, run_relay

RUNS = 4
RUN_TIMEOUT_S = 120


async def migrate(database_url: str) -> tuple[int, str]:
    """Run ``relay migrate`` against ``database_url``; its exit code and stderr."""
    env = {**os.environ, "RELAY_DATABASE_URL": database_url}
    code, _, err = await run_relay("migrate", env=env, timeout_s=RUN_TIMEOUT_S)
    return code, err.decode()


async def test_concurrent_first_migrations_all_exit_zero_and_apply_the_schema_once() -> None:
    database = f"relay_test_migrate_{new_id()[:10]}"
    url = f"postgresql://postgres@127.0.0.1:5432/{database}"
    try:
        runs = await asyncio.gather(*(migrate(url) for _ in range(RUNS)))
        assert [code for code, _ in runs] == [0] * RUNS, runs
        conn = await asyncpg.connect(url, timeout=10)
        try:
            applied = await conn.fetch("SELECT name FROM schema_migrations ORDER BY name")
        finally:
            await conn.close()
        assert [r["name"] for r in applied] == [name for name, _ in migration_files()]
    finally:
        admin = await asyncpg.connect(PG_ADMIN_URL, timeout=10)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        finally:
            await admin.close()
