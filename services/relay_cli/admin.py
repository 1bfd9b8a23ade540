"""Admin commands that talk to the ledger: migrate, workspaces and keys."""

from __future__ import annotations

import asyncpg

from relay.ledger.keys import CreatedKey, KeyStore
from relay.ledger.migrate import apply_migrations, ensure_database


async def migrate(database_url: str) -> list[str]:
    """Create the database if missing and apply pending migrations; return their names."""
    await ensure_database(database_url)
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        return await apply_migrations(conn)
    finally:
        await conn.close()


async def create_key(database_url: str, workspace: str, key: str | None = None) -> CreatedKey:
    """Create (or reuse) workspace ``workspace`` and a new API key for it."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1, timeout=10)
    assert pool is not None
    try:
        store = KeyStore(pool)
        workspace_id = await store.ensure_workspace(workspace)
        return await store.create_key(workspace_id, key)
    finally:
        await pool.close()
