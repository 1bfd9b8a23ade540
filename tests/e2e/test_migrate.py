"""``relay migrate`` as several pods run it at once, on a database nobody created yet."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import asyncpg

from relay_batches.ids import new_id
from relay_batches.ledger.migrate import migration_files
from tests.helpers.support import PG_ADMIN_URL

RELAY = str(Path(sys.executable).parent / "relay")
RUNS = 4
RUN_TIMEOUT_S = 120


async def migrate(database_url: str) -> tuple[int, str]:
    """Run ``relay migrate`` against ``database_url``; its exit code and stderr."""
    env = {**os.environ, "RELAY_DATABASE_URL": database_url}
    process = await asyncio.create_subprocess_exec(
        RELAY,
        "migrate",
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(process.communicate(), RUN_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, err.decode()


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
