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

Every POST is one row of ``webhook_attempts`` (the delivery log): :meth:`start_post`
bumps the delivery's ``attempts`` and inserts that attempt ``posting`` in the statement
that marks the claim ``posting``; :meth:`finish` and :meth:`mark_unknown` end it in the
statement that ends the delivery, both fenced like the delivery itself. An attempt that
did not deliver may leave the delivery ``retrying`` (the notifier decides, from the
:class:`Attempt` it was given): due at ``next_attempt_at``, it is listed and claimed by
the deferred pass like a deferred delivery (``retrying`` → ``sending``, ``claims`` + 1),
and its takeovers are counted from that claim (``claims_before``). ``retry_until`` (24 h
after the first attempt, set by the first :meth:`start_post`) bounds automatic retries:
one still due past it is given up.

Listing the waiting deliveries (:meth:`deferred`) reads every one of them; :meth:`probe`
is the cheap question asked between listings: has a delivery become due (or been
deferred) since a given time, of a receiver not busy here?
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from relay_batches.ledger.keys import generate_webhook_secret
from relay_batches.ledger.pool import translated
from relay_batches.ledger.status_sql import column_in, status_in
from relay_batches.ledger.webhook_endpoints import EndpointEvents
from relay_batches.model import DeliveryStatus, Job, delivery_allowed_from

MAX_CLAIMS = 3
DEFAULT_CLAIM_S = 30.0
RETRY_WINDOW_S = 24 * 3600.0  # automatic retries stop this long after the first attempt

# Constant, so the scans below use the partial index webhook_deliveries_sending.
_SENDING = status_in([DeliveryStatus.SENDING])

_RECLAIM = f"""
UPDATE webhook_deliveries d
SET claim_expires_at = now() + make_interval(secs => $1), claims = d.claims + 1
FROM (SELECT batch_id, endpoint_id FROM webhook_deliveries
      WHERE {_SENDING} AND NOT deferred AND claims - claims_before BETWEEN 1 AND $2 - 1
        AND COALESCE(claim_expires_at, created_at + make_interval(secs => $1)) < now()
      ORDER BY created_at LIMIT $3 FOR UPDATE SKIP LOCKED) q
WHERE d.batch_id = q.batch_id AND d.endpoint_id = q.endpoint_id
RETURNING d.batch_id, d.claims, d.endpoint_id
"""

_RETRYING = status_in([DeliveryStatus.RETRYING])

# Deferred deliveries (since they were recorded) and retrying ones that are due (since
# they were due), each set through its partial index (0009, 0016).
_WAITING = f"""
SELECT batch_id, endpoint_id, url, created_at AS since FROM webhook_deliveries
WHERE {_SENDING} AND deferred
UNION ALL
SELECT batch_id, endpoint_id, url, next_attempt_at FROM webhook_deliveries
WHERE {_RETRYING} AND next_attempt_at <= now()
"""

# The oldest $2 of each receiver (workspace and URL), oldest first, leaving out the
# workspaces $3 and the (workspace, URL) pairs $4/$5 the caller has busy: neither one
# receiver's backlog nor the busy receivers' hide another's.
_DEFERRED = f"""
SELECT batch_id, url, workspace_id, endpoint_id FROM (
    SELECT d.batch_id, d.url, b.workspace_id, d.since, d.endpoint_id,
           row_number() OVER (PARTITION BY b.workspace_id, d.url ORDER BY d.since) AS n
    FROM ({_WAITING}) d JOIN batches b ON b.id = d.batch_id
    WHERE b.workspace_id <> ALL($3::text[])
      AND NOT EXISTS (SELECT 1 FROM unnest($4::text[], $5::text[]) AS busy(w, u)
                      WHERE busy.w = b.workspace_id AND busy.u = d.url)) q
WHERE n <= $2
ORDER BY since LIMIT $1
"""

# Deliveries deferred ($1 as created_at) or come due ($1 as next_attempt_at) after $1, each
# a range of its partial index (0009 webhook_deliveries_deferred, 0016 …_retrying): a
# backlog waiting since before $1 is not read. $1 NULL (no listing yet) matches nothing.
_NEWLY_WAITING = f"""
SELECT batch_id, url FROM webhook_deliveries
WHERE {_SENDING} AND deferred AND created_at > $1
UNION ALL
SELECT batch_id, url FROM webhook_deliveries
WHERE {_RETRYING} AND next_attempt_at <= now() AND next_attempt_at > $1
"""

# Whether one of them is of a receiver (workspace $2, pairs $3/$4) not busy here; and the
# database's time, the caller's next $1.
_PROBE = f"""
SELECT now() AS at, EXISTS (
    SELECT 1 FROM ({_NEWLY_WAITING}) d JOIN batches b ON b.id = d.batch_id
    WHERE b.workspace_id <> ALL($2::text[])
      AND NOT EXISTS (SELECT 1 FROM unnest($3::text[], $4::text[]) AS busy(w, u)
                      WHERE busy.w = b.workspace_id AND busy.u = d.url)
) AS due
"""

# Back to deferred (nobody holds it), from the claim $2 taken over by a notifier whose
# receiver had no room for it.
_HAND_BACK = f"""
UPDATE webhook_deliveries SET deferred = true, claim_expires_at = now()
WHERE batch_id = $1 AND endpoint_id = $3 AND claims = $2 AND {_SENDING} AND NOT deferred
RETURNING batch_id
"""

# A deferred delivery, or a retrying one that is due ($3 sending); a retrying one's
# takeovers count from this claim on.
_CLAIM_DEFERRED = f"""
UPDATE webhook_deliveries SET status = $3, deferred = false, claims = claims + 1,
    claims_before = CASE WHEN {_RETRYING} THEN claims ELSE claims_before END,
    next_attempt_at = NULL, claim_expires_at = now() + make_interval(secs => $2)
WHERE batch_id = $1 AND endpoint_id = $4
  AND ((deferred AND {_SENDING}) OR ({_RETRYING} AND next_attempt_at <= now()))
RETURNING claims
"""

# $3 posting: the claim's POST is attempt attempts + 1, logged in the same statement; the
# delivery's last status code and error belong to the attempt before.
_START_POST = f"""
WITH d AS (
    UPDATE webhook_deliveries SET status = $3, attempts = attempts + 1,
        status_code = NULL, error = NULL,
        retry_until = COALESCE(retry_until, now() + make_interval(secs => $5)),
        claim_expires_at = now() + make_interval(secs => $4)
    WHERE batch_id = $1 AND endpoint_id = $6 AND claims = $2 AND {_SENDING}
    RETURNING batch_id, endpoint_id, attempts, redelivery, retry_until
), logged AS (
    INSERT INTO webhook_attempts (batch_id, endpoint_id, attempt, status, redelivery)
    SELECT batch_id, endpoint_id, attempts, $3, redelivery FROM d
)
SELECT d.attempts, COALESCE(w.webhook_max_attempts, 1) AS max_attempts, d.redelivery,
       EXTRACT(epoch FROM d.retry_until - now())::float8 AS retry_window_s
FROM d LEFT JOIN batches b ON b.id = d.batch_id LEFT JOIN workspaces w ON w.id = b.workspace_id
"""

_SILENT = "notifier went silent after starting the POST; it is never sent again"

# $1 unknown: posting claims whose holder went silent; claims unchanged, so it may record.
_LOSE = f"""
WITH lost AS (
    UPDATE webhook_deliveries SET status = $1, error = '{_SILENT}'
    WHERE {status_in([DeliveryStatus.POSTING])} AND claim_expires_at < now()
    RETURNING batch_id, endpoint_id, attempts
), logged AS (
    UPDATE webhook_attempts a SET status = $1, error = '{_SILENT}'
    FROM lost WHERE a.batch_id = lost.batch_id AND a.endpoint_id = lost.endpoint_id
      AND a.attempt = lost.attempts
      AND a.status = '{DeliveryStatus.POSTING}'
)
SELECT batch_id FROM lost
"""

# The delivery ends ($3; retrying: due in $8 s) and so does its attempt in flight ($7),
# if one is (a claim given up unsent has none: its last attempt has ended already).
_FINISH = f"""
WITH d AS (
    UPDATE webhook_deliveries SET status = $3, status_code = $4, error = $5,
        finished_at = now(), next_attempt_at = now() + make_interval(secs => $8)
    WHERE batch_id = $1 AND endpoint_id = $10 AND claims = $2 AND status = ANY($6::text[])
    RETURNING batch_id, endpoint_id, attempts
), logged AS (
    UPDATE webhook_attempts a SET status = $7, response_status = $4, error = $5,
        duration_ms = $9
    FROM d WHERE a.batch_id = d.batch_id AND a.endpoint_id = d.endpoint_id
      AND a.attempt = d.attempts
      AND {column_in("a.status", [DeliveryStatus.POSTING, DeliveryStatus.UNKNOWN])}
)
SELECT batch_id FROM d
"""

# A holder records over its own claim only: sending (given up unsent), posting, or
# unknown (back from an outage); never over a delivery that ended or is retrying.
_HELD = frozenset({DeliveryStatus.SENDING, DeliveryStatus.POSTING, DeliveryStatus.UNKNOWN})

# $3 failed: the end of claims taken over too often, never POSTed (sending → failed).
_ABANDON = f"""
UPDATE webhook_deliveries SET status = $3, finished_at = now(),
    error = 'notifier stopped during delivery ' || claims || ' times; giving up'
WHERE {_SENDING} AND NOT deferred AND claims - claims_before >= $2
  AND COALESCE(claim_expires_at, created_at + make_interval(secs => $1)) < now()
"""

# $1 failed: automatic retries still due past their retry_until (every notifier was away
# meanwhile) are given up; no automatic attempt goes out later than that.
_RETRIES_OVER = f"""
UPDATE webhook_deliveries SET status = $1, finished_at = now(), next_attempt_at = NULL,
    error = 'automatic retries ended: 24 h after the first attempt passed'
WHERE {_RETRYING} AND next_attempt_at <= now() AND NOT redelivery AND retry_until < now()
"""


@dataclass(frozen=True)
class Deferred:
    """A delivery waiting in the ledger for its receiver to have room."""

    batch_id: str
    url: str
    workspace_id: str
    endpoint_id: str = ""


@dataclass(frozen=True)
class Attempt:
    """The POST a claim marked ``posting`` makes: its number (1 for the first), how many
    the workspace allows (``webhook_max_attempts``), the seconds from the mark until
    automatic retries stop, and whether it is a redelivery asked for (never retried)."""

    number: int
    max_attempts: int = 1
    retry_window_s: float = 0.0
    redelivery: bool = False


@dataclass(frozen=True)
class Claim:
    """A delivery we hold: its batch, the claim number that fences our record, and the
    webhook endpoint it is for ('': the batch's own completion webhook)."""

    batch_id: str
    number: int
    endpoint_id: str = ""


@dataclass(frozen=True)
class Probe:
    """The answer of :meth:`DeliveryStore.probe`: the database's time when it was asked,
    and whether a delivery became due (or was deferred) since the time given."""

    at: datetime
    due: bool


class DeliveryStore(EndpointEvents):
    """The ``webhook_deliveries`` table and the batch read the notifier needs (the
    deliveries of webhook endpoints among them: :class:`EndpointEvents`)."""

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
                " ON CONFLICT (batch_id, endpoint_id) DO NOTHING RETURNING claims",
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
                " deferred, claim_expires_at)"
                " VALUES ($1, $2, $4, $3, 0, true, now())"
                " ON CONFLICT (batch_id, endpoint_id) DO NOTHING RETURNING batch_id",
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
        """The oldest ``limit`` deferred deliveries and due retrying ones, at most
        ``per_receiver`` of each workspace's URL, none of ``skip_workspaces`` nor of the
        ``(workspace, url)`` pairs ``skip_receivers`` (not locked: claim each before use)."""
        async with translated():
            records = await self._pool.fetch(
                _DEFERRED,
                limit,
                per_receiver,
                list(skip_workspaces),
                [w for w, _ in skip_receivers],
                [u for _, u in skip_receivers],
            )
        return [Deferred(r[0], r[1], r[2], r[3]) for r in records]

    async def probe(
        self,
        since: datetime | None,
        skip_workspaces: Sequence[str] = (),
        skip_receivers: Sequence[tuple[str, str]] = (),
    ) -> Probe:
        """Whether a delivery was deferred, or a retrying one came due, after ``since``
        (database time; None: nothing counts), of none of ``skip_workspaces`` nor the
        ``(workspace, url)`` pairs ``skip_receivers``; with the database's time now. Reads
        only those rows (two index ranges), not the backlog :meth:`deferred` lists."""
        async with translated():
            record = await self._pool.fetchrow(
                _PROBE,
                since,
                list(skip_workspaces),
                [w for w, _ in skip_receivers],
                [u for _, u in skip_receivers],
            )
        assert record is not None
        return Probe(record["at"], record["due"])

    async def hand_back(self, claim: Claim) -> bool:
        """Make a claim taken over into a deferred delivery again (unclaimed, for the
        deferred pass); False if ``claim`` is no longer the live one. Its count of
        takeovers starts again: only a notifier that dies holding it bumps it."""
        async with translated():
            value = await self._pool.fetchval(
                _HAND_BACK, claim.batch_id, claim.number, claim.endpoint_id
            )
        return value is not None

    async def claim_deferred(self, batch_id: str, endpoint_id: str = "") -> Claim | None:
        """Claim a deferred delivery, or a retrying one that is due (``retrying`` →
        ``sending``), of ``batch_id`` to ``endpoint_id`` ('': its own webhook); None if
        another notifier claimed it first (or it is not due)."""
        async with translated():
            number = await self._pool.fetchval(
                _CLAIM_DEFERRED, batch_id, self._claim_s, DeliveryStatus.SENDING, endpoint_id
            )
        return None if number is None else Claim(batch_id, number, endpoint_id)

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
        """Take over expired ``sending`` claims (their notifier died); give up old ones,
        and automatic retries still due past their ``retry_until``."""
        async with translated(), self._pool.acquire() as conn, conn.transaction():
            await conn.execute(_ABANDON, self._claim_s, MAX_CLAIMS, DeliveryStatus.FAILED)
            await conn.execute(_RETRIES_OVER, DeliveryStatus.FAILED)
            records = await conn.fetch(_RECLAIM, self._claim_s, MAX_CLAIMS, limit)
        return [Claim(r[0], r[1], r[2]) for r in records]

    async def start_post(self, claim: Claim) -> Attempt | None:
        """Mark the delivery ``posting`` (never POSTed again), renew its expiry and log its
        next attempt ``posting``, in one statement; return that attempt. None, marking
        nothing, when ``claim`` is no longer the live one: then do not POST."""
        async with translated():
            record = await self._pool.fetchrow(
                _START_POST,
                claim.batch_id,
                claim.number,
                DeliveryStatus.POSTING,
                self._claim_s,
                RETRY_WINDOW_S,
                claim.endpoint_id,
            )
        if record is None:
            return None
        return Attempt(
            record["attempts"],
            record["max_attempts"],
            max(0.0, record["retry_window_s"]),
            record["redelivery"],
        )

    async def mark_unknown(self) -> list[str]:
        """Mark ``unknown`` every ``posting`` claim past its expiry, and its attempt in the
        log; return their batches."""
        async with translated():
            records = await self._pool.fetch(_LOSE, DeliveryStatus.UNKNOWN)
        return [r[0] for r in records]

    async def finish(
        self,
        claim: Claim,
        status: DeliveryStatus,
        status_code: int | None,
        error: str | None,
        *,
        duration_ms: int | None = None,
        retry_in_s: float | None = None,
    ) -> bool:
        """Record how the delivery's attempt went (``delivered``, ``failed`` or
        ``refused``; ``retrying`` when another attempt is due in ``retry_in_s``, the
        attempt itself ``failed``), a guarded move from the statuses
        :func:`delivery_allowed_from` names that a holder may hold (``unknown`` among
        them: a holder back from an outage records what it knows); its attempt in the
        log gets the same, with ``duration_ms``, in the same statement.

        False, recording nothing, when ``claim`` is no longer the live one (it expired
        and was taken over, or given up): the record belongs to whoever holds it now.
        """
        attempt_status = DeliveryStatus.FAILED if status is DeliveryStatus.RETRYING else status
        allowed = [s for s in delivery_allowed_from(status) if s in _HELD]
        async with translated():
            value = await self._pool.fetchval(
                _FINISH,
                claim.batch_id,
                claim.number,
                status,
                status_code,
                error,
                allowed,
                attempt_status,
                retry_in_s if status is DeliveryStatus.RETRYING else None,
                duration_ms,
                claim.endpoint_id,
            )
        return value is not None
