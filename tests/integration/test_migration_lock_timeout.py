"""A migration whose table lock is held by an open transaction does not queue behind it
(which would stall every later query of the table): it times out, is rolled back and
retried, and succeeds once the holder commits; if the holder stays, ``relay migrate``
fails with one line naming the migration and the holder."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from relay_batches.ledger.migrate import LockRetry
from relay_batches.services.relay_cli import admin
from tests.helpers.support import Isolation, create_isolation, drop_isolation

PENDING = "0020_recorded_at.sql"  # ALTER TABLE batches ADD COLUMN: ACCESS EXCLUSIVE
TINY = LockRetry(lock_timeout_s=0.2, tries=3, first_wait_s=0.05, max_wait_s=0.1)


@pytest.fixture
async def pending() -> AsyncIterator[Isolation]:
    """A ledger migrated up to everything but ``PENDING``."""
    iso = await create_isolation("miglock")
    conn = await asyncpg.connect(iso.database_url, timeout=10)
    try:
        await conn.execute("ALTER TABLE batches DROP COLUMN recorded_at")
        await conn.execute("DELETE FROM schema_migrations WHERE name = $1", PENDING)
    finally:
        await conn.close()
    yield iso
    await drop_isolation(iso)


@pytest.fixture
async def blocker(pending: Isolation) -> AsyncIterator[asyncpg.Connection]:
    """An open transaction that has read ``batches`` (an ACCESS SHARE lock, like a
    results export), left open for the test to commit or not."""
    conn = await asyncpg.connect(pending.database_url, timeout=10)
    await conn.execute("BEGIN")
    await conn.fetchval("SELECT count(*) FROM batches")
    yield conn
    await conn.close()


class _Retries(logging.Handler):
    """Counts ``migration_lock_retry`` records and wakes a waiter on the first."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.first = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "migration_lock_retry":
            self.records.append(record)
            self.first.set()


@pytest.fixture
def retries() -> Iterator[_Retries]:
    handler = _Retries()
    logger = logging.getLogger("relay.migrate")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


async def _has_recorded_at(url: str) -> bool:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return bool(
            await conn.fetchval(
                "SELECT 1 FROM information_schema.columns"
                " WHERE table_name = 'batches' AND column_name = 'recorded_at'"
            )
        )
    finally:
        await conn.close()


async def test_a_blocked_migration_retries_and_applies_once_the_holder_commits(
    pending: Isolation, blocker: asyncpg.Connection, retries: _Retries
) -> None:
    patient = LockRetry(lock_timeout_s=0.2, tries=100, first_wait_s=0.05, max_wait_s=0.1)
    migrating = asyncio.create_task(admin.migrate(pending.database_url, patient))
    await asyncio.wait_for(retries.first.wait(), 10)
    record = retries.records[0]
    assert (record.migration, record.attempt, record.tries) == (PENDING, 1, 100)  # type: ignore[attr-defined]
    assert f"pid {blocker.get_server_pid()} " in record.held_by  # type: ignore[attr-defined]
    # Between tries nothing queues behind the migration: another session reads batches.
    reader = await asyncpg.connect(pending.database_url, timeout=10)
    try:
        assert await reader.fetchval("SELECT count(*) FROM batches", timeout=5) == 0
    finally:
        await reader.close()
    assert not migrating.done()
    await blocker.execute("COMMIT")
    assert await asyncio.wait_for(migrating, 10) == [PENDING]
    assert await _has_recorded_at(pending.database_url)


async def test_a_migration_still_blocked_after_its_tries_fails_with_one_line(
    pending: Isolation, blocker: asyncpg.Connection, retries: _Retries
) -> None:
    with pytest.raises(admin.AdminError) as failed:
        await admin.migrate(pending.database_url, TINY)
    message = str(failed.value)
    assert message.startswith(
        f"migration {PENDING} could not take its table locks in 3 tries of 0.2 s"
        f" (lock_timeout); held by: pid {blocker.get_server_pid()} (postgres,"
        " 'idle in transaction', transaction "
    )
    assert "batches AccessShareLock" in message
    assert "\n" not in message
    assert [r.attempt for r in retries.records] == [1, 2]  # type: ignore[attr-defined]
    assert not await _has_recorded_at(pending.database_url)
    await blocker.execute("COMMIT")
    assert await admin.migrate(pending.database_url, TINY) == [PENDING]
