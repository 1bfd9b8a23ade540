"""Workspaces and API keys: keys are stored as SHA-256 hashes and shown once."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import asyncpg

from relay.ids import new_id
from relay.ledger.pool import translated

KEY_PREFIX = "rk_"


def hash_key(key: str) -> bytes:
    """SHA-256 of an API key (right for high-entropy secrets)."""
    return hashlib.sha256(key.encode("utf-8")).digest()


def generate_key() -> str:
    """A new API key: ``rk_`` and 32 url-safe characters (192 bits from the CSPRNG)."""
    return KEY_PREFIX + secrets.token_urlsafe(24)


@dataclass(frozen=True)
class CreatedKey:
    """A key just created: the secret is only ever available here."""

    id: str
    workspace_id: str
    key: str


class KeyStore:
    """Workspaces and API keys in the ledger."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def ensure_workspace(self, name: str) -> str:
        """The id of workspace ``name``, creating it if missing."""
        async with translated():
            return str(
                await self._pool.fetchval(
                    "INSERT INTO workspaces (id, name) VALUES ($1, $2)"
                    " ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING id",
                    new_id(),
                    name,
                )
            )

    async def create_key(self, workspace_id: str, key: str | None = None) -> CreatedKey:
        """Store a new key (or the given one) for ``workspace_id``; return it once."""
        secret = key or generate_key()
        key_id = new_id()
        async with translated():
            await self._pool.execute(
                "INSERT INTO api_keys (id, workspace_id, key_hash, prefix) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (key_hash) DO NOTHING",
                key_id,
                workspace_id,
                hash_key(secret),
                secret[:8],
            )
        return CreatedKey(key_id, workspace_id, secret)

    async def workspace_for_key(self, key: str) -> str | None:
        """The workspace of an active key, or None for an unknown or revoked one."""
        async with translated():
            value = await self._pool.fetchval(
                "SELECT workspace_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL",
                hash_key(key),
            )
        return None if value is None else str(value)
