"""Workspaces and API keys.

A key is ``rk_`` plus 32 url-safe characters (192 bits from the CSPRNG), shown once at
creation. The ledger keeps its SHA-256 hash and an 8-character display prefix; a lookup
finds the candidates by prefix and compares hashes with :func:`hmac.compare_digest`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from relay_batches.errors import ConflictError
from relay_batches.ids import new_id
from relay_batches.ledger.pool import translated

KEY_PREFIX = "rk_"
DISPLAY_PREFIX_CHARS = 8
WEBHOOK_SECRET_PREFIX = "whsec_"


def hash_key(key: str) -> bytes:
    """SHA-256 of an API key (right for high-entropy secrets)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def generate_key() -> str:
    """A new API key: ``rk_`` and 32 url-safe characters (192 bits from the CSPRNG)."""
    return KEY_PREFIX + secrets.token_urlsafe(24)


def generate_webhook_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and base64 of 32 random bytes."""
    return WEBHOOK_SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


@dataclass(frozen=True)
class CreatedKey:
    """A key just created: the secret is only ever available here."""

    id: str
    workspace_id: str
    key: str


@dataclass(frozen=True)
class KeyInfo:
    """A key as ``relay keys list`` shows it (never the secret)."""

    id: str
    workspace: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True)
class WorkspaceInfo:
    """A workspace as ``relay workspaces list`` shows it."""

    id: str
    name: str
    created_at: datetime
    keys: int


class KeyStore:
    """Workspaces and API keys in the ledger."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def ensure_workspace(self, name: str) -> str:
        """The id of workspace ``name``, creating it (with a webhook secret) if missing."""
        async with translated():
            return str(
                await self._pool.fetchval(
                    "INSERT INTO workspaces (id, name, webhook_secret) VALUES ($1, $2, $3)"
                    " ON CONFLICT (name) DO UPDATE SET webhook_secret ="
                    "   COALESCE(workspaces.webhook_secret, EXCLUDED.webhook_secret)"
                    " RETURNING id",
                    new_id(),
                    name,
                    generate_webhook_secret(),
                )
            )

    async def workspace_id(self, name: str) -> str | None:
        """The id of workspace ``name``, or None."""
        async with translated():
            value = await self._pool.fetchval("SELECT id FROM workspaces WHERE name = $1", name)
        return None if value is None else str(value)

    async def list_workspaces(self) -> list[WorkspaceInfo]:
        """Every workspace with its count of active keys."""
        async with translated():
            records = await self._pool.fetch(
                "SELECT w.id, w.name, w.created_at,"
                " (SELECT count(*) FROM api_keys k"
                "  WHERE k.workspace_id = w.id AND k.revoked_at IS NULL) AS keys"
                " FROM workspaces w ORDER BY w.name"
            )
        return [WorkspaceInfo(*r) for r in records]

    async def rotate_webhook_secret(self, name: str) -> str | None:
        """Give workspace ``name`` a new webhook secret; return it (None if no workspace)."""
        secret = generate_webhook_secret()
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE workspaces SET webhook_secret = $2 WHERE name = $1 RETURNING id",
                name,
                secret,
            )
        return None if value is None else secret

    async def set_webhook_max_attempts(self, name: str, max_attempts: int) -> int | None:
        """Give workspace ``name``'s completion webhooks up to ``max_attempts`` attempts
        each (1: once, no retry); return the stored value (None if no workspace)."""
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE workspaces SET webhook_max_attempts = $2 WHERE name = $1"
                " RETURNING webhook_max_attempts",
                name,
                max_attempts,
            )
        return None if value is None else int(value)

    async def create_key(self, workspace_id: str, key: str | None = None) -> CreatedKey:
        """Store a new key (or the given one) for ``workspace_id``; return it once.

        A given key that is stored already (``relay dev`` with ``RELAY_DEV_API_KEY`` run
        again) is returned with its stored id; :class:`ConflictError` if it belongs to
        another workspace or was revoked, since it could not serve this workspace.
        """
        secret = key or generate_key()
        digest = hash_key(secret)
        async with translated():
            key_id = await self._pool.fetchval(
                "INSERT INTO api_keys (id, workspace_id, key_hash, prefix) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (key_hash) DO NOTHING RETURNING id",
                new_id(),
                workspace_id,
                digest,
                secret[:DISPLAY_PREFIX_CHARS],
            )
            if key_id is not None:
                return CreatedKey(str(key_id), workspace_id, secret)
            # Stored before: this new statement sees the committed row (keys are never
            # deleted, only revoked).
            existing = await self._pool.fetchrow(
                "SELECT id, workspace_id, revoked_at FROM api_keys WHERE key_hash = $1", digest
            )
        if existing is None:  # the conflicting row cannot vanish: keys are never deleted
            raise ConflictError(f"the key {secret[:DISPLAY_PREFIX_CHARS]}… could not be stored")
        return _reuse(existing, workspace_id, secret)

    async def list_keys(self, workspace: str | None = None) -> list[KeyInfo]:
        """Keys (all, or of one workspace by name), newest first."""
        async with translated():
            records = await self._pool.fetch(
                "SELECT k.id, w.name, k.prefix, k.created_at, k.revoked_at"
                " FROM api_keys k JOIN workspaces w ON w.id = k.workspace_id"
                " WHERE $1::text IS NULL OR w.name = $1 ORDER BY k.created_at DESC",
                workspace,
            )
        return [KeyInfo(*r) for r in records]

    async def revoke_key(self, key_id: str) -> bool:
        """Revoke a key by id; False if there is no such active key."""
        async with translated():
            value = await self._pool.fetchval(
                "UPDATE api_keys SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL"
                " RETURNING id",
                key_id,
            )
        return value is not None

    async def workspace_for_key(self, key: str) -> str | None:
        """The workspace of an active key, or None for an unknown or revoked one."""
        digest = hash_key(key)
        async with translated():
            records = await self._pool.fetch(
                "SELECT workspace_id, key_hash FROM api_keys"
                " WHERE prefix = $1 AND revoked_at IS NULL",
                key[:DISPLAY_PREFIX_CHARS],
            )
        found = None
        for record in records:
            if hmac.compare_digest(bytes(record["key_hash"]), digest):
                found = str(record["workspace_id"])
        return found


def _reuse(existing: asyncpg.Record, workspace_id: str, secret: str) -> CreatedKey:
    """The stored key ``existing`` for ``workspace_id``, if it can serve that workspace."""
    shown = f"{secret[:DISPLAY_PREFIX_CHARS]}… (id {existing['id']})"
    if existing["workspace_id"] != workspace_id:
        raise ConflictError(f"the key {shown} already belongs to another workspace")
    if existing["revoked_at"] is not None:
        raise ConflictError(f"the key {shown} was revoked; choose another key")
    return CreatedKey(str(existing["id"]), workspace_id, secret)
