"""Webhook deliveries: claimed before the POST so a redelivered event never POSTs twice."""

from __future__ import annotations

import asyncpg

from relay.batches import Batch
from relay.ledger.keys import generate_webhook_secret
from relay.ledger.pool import translated


class DeliveryStore:
    """The ``webhook_deliveries`` table and the batch read the notifier needs."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def batch(self, batch_id: str) -> Batch | None:
        """The batch ``batch_id`` (any workspace: the notifier serves them all)."""
        async with translated():
            record = await self._pool.fetchrow("SELECT * FROM batches WHERE id = $1", batch_id)
        return None if record is None else Batch.from_record(record)

    async def claim(self, batch_id: str, url: str, message_id: str) -> bool:
        """Claim the one delivery of ``batch_id``; False if it was claimed before."""
        async with translated():
            value = await self._pool.fetchval(
                "INSERT INTO webhook_deliveries (batch_id, url, status, message_id)"
                " VALUES ($1, $2, 'sending', $3)"
                " ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id",
                batch_id,
                url,
                message_id,
            )
        return value is not None

    async def signing_secret(self, workspace_id: str) -> str:
        """The workspace's webhook secret, created on first use for older workspaces."""
        async with translated():
            return str(
                await self._pool.fetchval(
                    "UPDATE workspaces SET webhook_secret ="
                    " COALESCE(webhook_secret, $2) WHERE id = $1 RETURNING webhook_secret",
                    workspace_id,
                    generate_webhook_secret(),
                )
            )

    async def finish(
        self, batch_id: str, status: str, status_code: int | None, error: str | None
    ) -> None:
        """Record how the delivery ended (``delivered``, ``failed`` or ``refused``)."""
        async with translated():
            await self._pool.execute(
                "UPDATE webhook_deliveries SET status = $2, status_code = $3, error = $4,"
                " finished_at = now() WHERE batch_id = $1",
                batch_id,
                status,
                status_code,
                error,
            )
