"""Webhook deliveries: claimed before the POST so a redelivered event never POSTs twice.

A claim carries an expiry longer than any POST can take. A claim still ``sending`` past
its expiry belongs to a notifier that died before its POST: another notifier (or the
same one after a restart) may take it over, a bounded number of times, and then gives
up with ``failed``.

Right before its POST the holder moves its claim to ``posting`` (renewing the expiry);
from then on the delivery is never POSTed again. A ``posting`` claim past its expiry
becomes ``unknown``, without a takeover: its notifier died after the POST may have gone
out, or it is alive but cut off from the database, and records the outcome when it
returns (the ``claims`` number it holds is unchanged).

A delivery whose receiver is busy is deferred: recorded ``sending`` with ``deferred``
set (nobody holds it; the ``job.finished`` that carried it is acked) and claimed later,
as its receiver has room, by a notifier's deferred pass. Takeovers never touch it; a
takeover whose receiver is full is handed back deferred, keeping its claim number.

Every claim and takeover bumps ``claims`` (it never goes down), and the holder moves
its claim on only while the row has the ``claims`` it was given: a notifier whose claim
was taken over (it outlived its claim while still ``sending``) can neither POST nor
overwrite the new owner's record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from relay_batches.ledger.keys import generate_webhook_secret
from relay_batches.ledger.pool import translated
from relay_batches.ledger.status_sql import status_in
from relay_batches.model import DeliveryStatus, Job, delivery_allowed_from

MAX_CLAIMS = 3
DEFAULT_CLAIM_S = 30.0

# Constant, so the scans below use the partial index webhook_deliveries_sending.
_SENDING = status_in([DeliveryStatus.SENDING])

_RECLAIM = f"""
UPDATE webhook_deliveries d
SET claim_expires_at = now() + make_interval(secs => $1), claims = d.claims + 1
FROM (SELECT batch_id FROM webhook_deliveries
      WHERE {_SENDING} AND NOT deferred AND claims BETWEEN 1 AND $2 - 1
        AND COALESCE(claim_expires_at, created_at + make_interval(secs => $1)) < now()
      ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED) q
WHERE d.batch_id = q.batch_id
RETURNING d.batch_id, d.claims
"""

# The oldest $2 of each receiver (workspace and URL), oldest first, leaving out the
# workspaces $3 and the (workspace, URL) pairs $4/$5 the caller has busy: neither one
# receiver's backlog nor the busy receivers' hide another's.
_DEFERRED = f"""
SELECT batch_id, url, workspace_id FROM (
    SELECT d.batch_id, d.url, b.workspace_id, d.created_at,
           row_number() OVER (PARTITION BY b.workspace_id, d.url ORDER BY d.created_at) AS n
    FROM webhook_deliveries d JOIN batches b ON b.id = d.batch_id
    WHERE d.{_SENDING} AND d.deferred
      AND b.workspace_id <> ALL($3::text[])
      AND NOT EXISTS (SELECT 1 FROM unnest($4::text[], $5::text[]) AS busy(w, u)
                      WHERE busy.w = b.workspace_id AND busy.u = d.url)) q
WHERE n <= $2
ORDER BY created_at LIMIT $1
"""

# Back to deferred (nobody holds it), from the claim $2 taken over by a notifier whose
# receiver had no room for it.
_HAND_BACK = f"""
UPDATE webhook_deliveries SET deferred = true, claim_expires_at = now()
WHERE batch_id = $1 AND claims = $2 AND {_SENDING} AND NOT deferred
RETURNING batch_id
"""

_CLAIM_DEFERRED = f"""
UPDATE webhook_deliveries SET deferred = false, claims = claims + 1,
    claim_expires_at = now() + make_interval(secs => $2)
WHERE batch_id = $1 AND deferred AND {_SENDING}
RETURNING claims
"""

_START_POST = f"""
UPDATE webhook_deliveries SET status = $3, claim_expires_at = now() + make_interval(secs => $4)
WHERE batch_id = $1 AND claims = $2 AND {_SENDING}
RETURNING batch_id
"""

# $1 unknown: posting claims whose holder went silent; claims unchanged, so it may record.
_LOSE = f"""
UPDATE webhook_deliveries SET status = $1,
    error = 'notifier went silent after starting the POST; it is never sent again'
WHERE {status_in([DeliveryStatus.POSTING])} AND claim_expires_at < now()
RETURNING batch_id
"""

_FINISH = """
UPDATE webhook_deliveries SET status = $3, status_code = $4, error = $5, finished_at = now()
WHERE batch_id = $1 AND claims = $2 AND status = ANY($6::text[])
RETURNING batch_id
"""

# $3 failed: the end of claims taken over too often, never POSTed (sending → failed).
_ABANDON = f"""
UPDATE webhook_deliveries SET status = $3, finished_at = now(),
    error = 'notifier stopped during delivery ' || claims || ' times; giving up'
WHERE {_SENDING} AND NOT deferred AND claims >= $2
  AND COALESCE(claim_expires_at, created_at + make_interval(secs => $1)) < now()
"""


@dataclass(frozen=True)
class Deferred:
    """A delivery waiting in the ledger for its receiver to have room."""

    batch_id: str
    url: str
    workspace_id: str


@dataclass(frozen=True)
class Claim:
    """A delivery we hold: its batch and the claim number that fences our record."""

    batch_id: str
    number: int


class DeliveryStore:
    """The ``webhook_deliveries`` table and the batch read the notifier needs."""

    def __init__(self, pool: asyncpg.Pool, claim_s: float = DEFAULT_CLAIM_S) -> None:
        self._pool = pool
        self._claim_s = claim_s

    async def job(self, batch_id: str) -> Job | None:
        """The batch ``batch_id`` (any workspace: the notifier serves them all)."""
        async with translated():
            record = await self._pool.fetchrow("SELECT * FROM batches WHERE id = $1", batch_id)
        return None if record is None else Job.from_record(record)

    async def claim(self, batch_id: str, url: str, message_id: str) -> Claim | None:
        """Claim the one delivery of ``batch_id``; None if it was claimed before."""
        async with translated():
            number = await self._pool.fetchval(
                "INSERT INTO webhook_deliveries (batch_id, url, status, message_id,"
                " claim_expires_at)"
                " VALUES ($1, $2, $5, $3, now() + make_interval(secs => $4))"
                " ON CONFLICT (batch_id) DO NOTHING RETURNING claims",
                batch_id,
                url,
                message_id,
                self._claim_s,
                DeliveryStatus.SENDING,
            )
        return None if number is None else Claim(batch_id, number)

    async def defer(self, batch_id: str, url: str, message_id: str) -> bool:
        """Record the delivery of ``batch_id`` as deferred (unclaimed, for a later pass);
        False if it was claimed or deferred before."""
        async with translated():
            value = await self._pool.fetchval(
                "INSERT INTO webhook_deliveries (batch_id, url, status, message_id, claims,"
                " deferred, claim_expires_at) VALUES ($1, $2, $4, $3, 0, true, now())"
                " ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id",
                batch_id,
                url,
                message_id,
                DeliveryStatus.SENDING,
            )
        return value is not None

    async def deferred(
        self,
        limit: int,
        per_receiver: int,
        skip_workspaces: Sequence[str] = (),
        skip_receivers: Sequence[tuple[str, str]] = (),
    ) -> list[Deferred]:
        """The oldest ``limit`` deferred deliveries, at most ``per_receiver`` of each
        workspace's URL, none of ``skip_workspaces`` nor of the ``(workspace, url)``
        pairs ``skip_receivers`` (not locked: claim each before use)."""
        async with translated():
            records = await self._pool.fetch(
                _DEFERRED,
                limit,
                per_receiver,
                list(skip_workspaces),
                [w for w, _ in skip_receivers],
                [u for _, u in skip_receivers],
            )
        return [Deferred(r[0], r[1], r[2]) for r in records]

    async def hand_back(self, claim: Claim) -> bool:
        """Make a claim taken over into a deferred delivery again (unclaimed, for the
        deferred pass); False if ``claim`` is no longer the live one. Its count of
        takeovers starts again: only a notifier that dies holding it bumps it."""
        async with translated():
            value = await self._pool.fetchval(_HAND_BACK, claim.batch_id, claim.number)
        return value is not None

    async def claim_deferred(self, batch_id: str) -> Claim | None:
        """Claim a deferred delivery; None if another notifier claimed it first."""
        async with translated():
            number = await self._pool.fetchval(_CLAIM_DEFERRED, batch_id, self._claim_s)
        return None if number is None else Claim(batch_id, number)

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

    async def reclaim_expired(self, limit: int = 20) -> list[Claim]:
        """Take over expired ``sending`` claims (their notifier died); give up old ones."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            await conn.execute(_ABANDON, self._claim_s, MAX_CLAIMS, DeliveryStatus.FAILED)
            records = await conn.fetch(_RECLAIM, self._claim_s, MAX_CLAIMS, limit)
        return [Claim(r[0], r[1]) for r in records]

    async def start_post(self, claim: Claim) -> bool:
        """Mark the delivery ``posting`` (never POSTed again) and renew its expiry; False,
        marking nothing, when ``claim`` is no longer the live one: then do not POST."""
        async with translated():
            value = await self._pool.fetchval(
                _START_POST, claim.batch_id, claim.number, DeliveryStatus.POSTING, self._claim_s
            )
        return value is not None

    async def mark_unknown(self) -> list[str]:
        """Mark ``unknown`` every ``posting`` claim past its expiry; return their batches."""
        async with translated():
            records = await self._pool.fetch(_LOSE, DeliveryStatus.UNKNOWN)
        return [r[0] for r in records]

    async def finish(
        self, claim: Claim, status: DeliveryStatus, status_code: int | None, error: str | None
    ) -> bool:
        """Record how the delivery ended (``delivered``, ``failed`` or ``refused``), a
        guarded move from the statuses :func:`delivery_allowed_from` names (``unknown``
        among them: a holder back from an outage records what it knows).

        False, recording nothing, when ``claim`` is no longer the live one (it expired
        and was taken over, or given up): the record belongs to whoever holds it now.
        """
        async with translated():
            value = await self._pool.fetchval(
                _FINISH,
                claim.batch_id,
                claim.number,
                status,
                status_code,
                error,
                delivery_allowed_from(status),
            )
        return value is not None
