"""Creating a given API key (``relay dev`` with ``RELAY_DEV_API_KEY``) against the ledger."""

from __future__ import annotations

import asyncpg
import pytest

from relay_batches.errors import ConflictError
from relay_batches.ids import new_id
from relay_batches.ledger.keys import KeyStore, generate_key
from relay_batches.services.relay_cli import admin
from tests.helpers.support import Isolation


async def test_a_given_key_stored_before_returns_its_stored_id(pool: asyncpg.Pool) -> None:
    store = KeyStore(pool)
    workspace = await store.ensure_workspace(f"dev-{new_id()[:8]}")
    key = generate_key()
    first = await store.create_key(workspace, key)
    again = await store.create_key(workspace, key)  # `relay dev` started a second time
    assert again == first
    stored = await pool.fetch("SELECT id FROM api_keys WHERE workspace_id = $1", workspace)
    assert [r["id"] for r in stored] == [first.id]
    assert await store.revoke_key(again.id)  # the id printed is one the ledger knows
    assert await store.workspace_for_key(key) is None


async def test_a_given_key_of_another_workspace_is_refused(pool: asyncpg.Pool) -> None:
    store = KeyStore(pool)
    owner = await store.ensure_workspace(f"own-{new_id()[:8]}")
    other = await store.ensure_workspace(f"oth-{new_id()[:8]}")
    key = generate_key()
    await store.create_key(owner, key)
    with pytest.raises(ConflictError, match="already belongs to another workspace") as err:
        await store.create_key(other, key)
    assert key not in str(err.value)  # never echo the secret
    assert await store.workspace_for_key(key) == owner


async def test_a_given_key_that_was_revoked_is_refused(pool: asyncpg.Pool) -> None:
    store = KeyStore(pool)
    workspace = await store.ensure_workspace(f"rev-{new_id()[:8]}")
    key = generate_key()
    created = await store.create_key(workspace, key)
    assert await store.revoke_key(created.id)
    with pytest.raises(ConflictError, match="was revoked"):
        await store.create_key(workspace, key)


async def test_admin_create_key_explains_a_refused_key(iso: Isolation) -> None:
    key = generate_key()
    await admin.create_key(iso.database_url, f"a-{new_id()[:8]}", key)
    with pytest.raises(admin.AdminError, match="another workspace"):
        await admin.create_key(iso.database_url, f"b-{new_id()[:8]}", key)


async def test_generated_keys_are_new_each_time(pool: asyncpg.Pool) -> None:
    store = KeyStore(pool)
    workspace = await store.ensure_workspace(f"gen-{new_id()[:8]}")
    first, second = await store.create_key(workspace), await store.create_key(workspace)
    assert first.id != second.id and first.key != second.key
    assert await store.workspace_for_key(second.key) == workspace
