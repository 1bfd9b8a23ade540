"""``Idempotency-Key`` records: the first response to a key, kept for 24 hours.

A request with a key first looks for a live record (:meth:`IdempotencyStore.find`). If
there is none, the request does its work and records its response with
:func:`record_response` *inside the same transaction*, so two concurrent requests with
one key never both create something: the second blocks on the key, finds it taken and
replays the first response.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from relay_batches.ledger.pool import Connection, translated

TTL_HOURS = 24


class KeyTaken(Exception):
    """Another request recorded a response for this key first."""


@dataclass(frozen=True)
class IdempotencyClaim:
    """A request's key and the hash of what it asked for."""

    workspace_id: str
    key: str
    request_hash: bytes


@dataclass(frozen=True)
class StoredResponse:
    """The response first given for a key."""

    request_hash: bytes
    status: int
    body: str


async def record_response(
    conn: Connection, claim: IdempotencyClaim, status: int, body: str
) -> None:
    """Record the response for ``claim`` in the caller's transaction; :class:`KeyTaken`
    if a live record exists (an expired one is replaced)."""
    taken = await conn.fetchval(
        "INSERT INTO idempotency_keys (workspace_id, key, request_hash, response_status,"
        " response_body) VALUES ($1, $2, $3, $4, $5)"
        " ON CONFLICT (workspace_id, key) DO UPDATE SET request_hash = EXCLUDED.request_hash,"
        "   response_status = EXCLUDED.response_status,"
        "   response_body = EXCLUDED.response_body, created_at = now()"
        f" WHERE idempotency_keys.created_at < now() - interval '{TTL_HOURS} hours'"
        " RETURNING 1",
        claim.workspace_id,
        claim.key,
        claim.request_hash,
        status,
        body,
    )
    if taken is None:
        raise KeyTaken(claim.key)


class IdempotencyStore:
    """Reads of live idempotency records."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def find(self, workspace_id: str, key: str) -> StoredResponse | None:
        """The live record of ``key`` in ``workspace_id``, if any."""
        async with translated():
            record = await self._pool.fetchrow(
                "SELECT request_hash, response_status, response_body FROM idempotency_keys"
                " WHERE workspace_id = $1 AND key = $2"
                f" AND created_at >= now() - interval '{TTL_HOURS} hours'",
                workspace_id,
                key,
            )
        if record is None:
            return None
        return StoredResponse(bytes(record[0]), record[1], record[2])
