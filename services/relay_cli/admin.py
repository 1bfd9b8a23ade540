"""Admin commands that talk to the ledger: migrate, workspaces and keys."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

import asyncpg

from relay_batches.errors import ConflictError
from relay_batches.ledger.keys import CreatedKey, KeyInfo, KeyStore, WorkspaceInfo
from relay_batches.ledger.migrate import (
    LockRetry,
    MigrationLockError,
    apply_migrations,
    ensure_database,
)
from relay_batches.ledger.retention import set_workspace_retention
from relay_batches.reach import DATABASE, reaching


class AdminError(Exception):
    """An admin command cannot do what was asked (unknown workspace, key…)."""


async def migrate(database_url: str, retry: LockRetry | None = None) -> list[str]:
    """Create the database if missing and apply pending migrations; return their names.

    A migration that cannot take its table locks (``retry``, see
    :class:`~relay_batches.ledger.migrate.LockRetry`) is an :class:`AdminError`; a
    database that cannot be reached is :class:`~relay_batches.reach.Unreachable`.
    """
    async with reaching(DATABASE, database_url):
        await ensure_database(database_url)
        conn = await asyncpg.connect(database_url, timeout=10)
    try:
        return await apply_migrations(conn, retry)
    except MigrationLockError as exc:
        raise AdminError(str(exc)) from None
    finally:
        await conn.close()


@asynccontextmanager
async def _keys(database_url: str) -> AsyncIterator[KeyStore]:
    async with reaching(DATABASE, database_url):
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1, timeout=10)
    assert pool is not None
    try:
        yield KeyStore(pool)
    finally:
        await pool.close()


async def create_key(database_url: str, workspace: str, key: str | None = None) -> CreatedKey:
    """Create (or reuse) workspace ``workspace`` and a new API key for it (or ``key``,
    reused when it is stored for that workspace already)."""
    async with _keys(database_url) as store:
        workspace_id = await store.ensure_workspace(workspace)
        try:
            return await store.create_key(workspace_id, key)
        except ConflictError as exc:
            raise AdminError(f"cannot use that key for workspace {workspace!r}: {exc}") from None


async def list_keys(database_url: str, workspace: str | None) -> list[KeyInfo]:
    """Keys of every workspace, or of one."""
    async with _keys(database_url) as store:
        if workspace is not None and await store.workspace_id(workspace) is None:
            raise AdminError(f"no workspace named {workspace!r}")
        return await store.list_keys(workspace)


async def revoke_key(database_url: str, key_id: str) -> None:
    """Revoke key ``key_id``; :class:`AdminError` if there is no such active key."""
    async with _keys(database_url) as store:
        if not await store.revoke_key(key_id):
            raise AdminError(f"no active key with id {key_id!r}")


async def create_workspace(database_url: str, name: str) -> str:
    """Create workspace ``name`` (idempotent); return its id."""
    async with _keys(database_url) as store:
        return await store.ensure_workspace(name)


async def list_workspaces(database_url: str) -> list[WorkspaceInfo]:
    """Every workspace."""
    async with _keys(database_url) as store:
        return await store.list_workspaces()


MAX_WEBHOOK_ATTEMPTS = 20


async def set_webhook_retries(database_url: str, name: str, max_attempts: int) -> int:
    """Let workspace ``name``'s completion webhooks take up to ``max_attempts`` attempts
    (1..``MAX_WEBHOOK_ATTEMPTS``; 1 is the default rule: once, no retry); return it."""
    if not 1 <= max_attempts <= MAX_WEBHOOK_ATTEMPTS:
        raise AdminError(f"--max-attempts must be from 1 to {MAX_WEBHOOK_ATTEMPTS}")
    async with _keys(database_url) as store:
        stored = await store.set_webhook_max_attempts(name, max_attempts)
    if stored is None:
        raise AdminError(f"no workspace named {name!r}")
    return stored


async def set_retention(database_url: str, name: str, retention: timedelta | None) -> None:
    """Keep workspace ``name``'s ended jobs for ``retention`` (None: ``RELAY_RETENTION``)."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1, timeout=10)
    assert pool is not None
    try:
        found = await set_workspace_retention(pool, name, retention)
    finally:
        await pool.close()
    if not found:
        raise AdminError(f"no workspace named {name!r}")


async def rotate_webhook_secret(database_url: str, name: str) -> str:
    """A new webhook signing secret for workspace ``name``."""
    async with _keys(database_url) as store:
        secret = await store.rotate_webhook_secret(name)
    if secret is None:
        raise AdminError(f"no workspace named {name!r}")
    return secret
