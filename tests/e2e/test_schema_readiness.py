"""Readiness follows the schema: on a fresh, unmigrated database every service answers
``/readyz`` 503 and the API answers 503 (its error object, ``Retry-After``) instead of a
500, until ``relay migrate`` has run; then they become ready by themselves."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from relay_batches.ledger.migrate import migration_files
from relay_batches.services.relay_cli import admin
from tests.helpers.checks import wait_all_not_ready, wait_all_ready
from tests.helpers.processes import BIN, ServiceProcess, System, build_system
from tests.helpers.support import create_isolation, drop_isolation

STARTED = ("ingest-api", "dispatcher", "aggregator", "notifier", "scheduler")


@pytest.fixture
async def unmigrated(output_dir: Path) -> AsyncIterator[System]:
    """A system on an empty database (no migration ran); only :data:`STARTED` run."""
    iso = await create_isolation("schema", migrated=False)
    log_dir = output_dir / "e2e-schema"
    for old in log_dir.glob("*.log"):
        old.unlink()
    system = build_system(iso, log_dir)
    for name in STARTED:
        system.processes[name].start()
    try:
        yield system
    finally:
        codes = {name: system.processes[name].stop() for name in STARTED}
        await drop_isolation(iso)
    assert all(code == 0 for code in codes.values()), f"unclean exits: {codes}"


async def relay_migrate(database_url: str) -> str:
    """Run ``relay migrate`` against ``database_url``; its output."""
    process = await asyncio.create_subprocess_exec(
        str(BIN / "relay"),
        "migrate",
        env={**os.environ, "RELAY_DATABASE_URL": database_url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, output.decode()
    return output.decode()


async def test_services_are_not_ready_until_the_migration_has_run(
    unmigrated: System, http: aiohttp.ClientSession
) -> None:
    procs: list[ServiceProcess] = [unmigrated.processes[name] for name in STARTED]
    statuses = await wait_all_not_ready(procs, http)
    assert statuses == dict.fromkeys(STARTED, 503)
    batches = f"{unmigrated.api_url}/v1/batches"
    headers = {"Authorization": "Bearer rk_not_yet_a_key"}
    async with http.get(batches, headers=headers) as response:
        assert response.status == 503
        assert response.headers["Retry-After"] == "2"
        assert await response.json() == {
            "error": {
                "type": "internal_error",
                "message": "service temporarily unavailable, retry shortly",
                "param": None,
            }
        }

    output = await relay_migrate(unmigrated.iso.database_url)
    names = [name for name, _ in migration_files()]
    assert output.strip() == f"applied {len(names)} migration(s): {', '.join(names)}"

    await wait_all_ready(procs, http, timeout=30)
    created = await admin.create_key(unmigrated.iso.database_url, "schema")
    headers = {"Authorization": f"Bearer {created.key}"}
    async with http.get(batches, headers=headers) as response:
        assert response.status == 200
        listing = await response.json()
    assert listing["data"] == []
