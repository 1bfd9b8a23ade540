"""The retention reaper: each pass purges ended jobs past their retention, settled
provider batch records past it and idempotency records past their 24 hours, one
bounded transaction after another, until none is due (see
:mod:`relay_batches.ledger.retention`).

No asyncpg here: the store is passed in.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from relay_batches.ledger.retention import Purged, PurgedOffloads
from relay_batches.metrics import (
    IDEMPOTENCY_KEYS_PURGED,
    RETENTION_JOBS_PURGED,
    RETENTION_OFFLOADS_PURGED,
    RETENTION_ROWS_PURGED,
)

log = logging.getLogger("relay.scheduler")

KEYS_PAGE = 5_000
# A pass ends after this many transactions (the next pass goes on): a backlog is worked
# off over several passes, and the scheduler's stop is never held up by one.
MAX_TRANSACTIONS = 200


class RetentionLedger(Protocol):
    """What the retention reaper needs of the ledger."""

    async def purge_jobs(self) -> Purged:
        """Purge up to one transaction's budget of due ended jobs."""

    async def purge_offload_batches(self) -> PurgedOffloads:
        """Purge up to one transaction's budget of due settled provider batch records."""

    async def purge_idempotency_keys(self, limit: int) -> int:
        """Delete up to ``limit`` expired idempotency records; how many."""


class Purger:
    """One retention pass at a time over a :class:`RetentionLedger`."""

    def __init__(self, store: RetentionLedger) -> None:
        self._store = store

    async def purge_pass(self) -> Purged:
        """Purge what is due (jobs, provider batch records, then idempotency records);
        what was purged of jobs."""
        started = time.monotonic()
        jobs = rows = 0
        for _ in range(MAX_TRANSACTIONS):
            purged = await self._store.purge_jobs()
            if purged.jobs == 0 and purged.trimmed == 0:
                break
            jobs += purged.jobs
            rows += purged.rows
            RETENTION_JOBS_PURGED.inc(purged.jobs)
            RETENTION_ROWS_PURGED.inc(purged.rows)
        offloads = await self._purge_offloads()
        keys = await self._purge_keys()
        if jobs or offloads or keys:
            log.info(
                "retention_purged",
                extra={
                    "jobs": jobs,
                    "rows": rows,
                    "offload_batches": offloads,
                    "idempotency_keys": keys,
                    "elapsed_s": round(time.monotonic() - started, 3),
                },
            )
        return Purged(jobs, rows)

    async def _purge_offloads(self) -> int:
        records = 0
        for _ in range(MAX_TRANSACTIONS):
            purged = await self._store.purge_offload_batches()
            records += purged.records
            RETENTION_OFFLOADS_PURGED.inc(purged.records)
            if purged.records == 0 and purged.detached == 0:
                break
        return records

    async def _purge_keys(self) -> int:
        keys = 0
        for _ in range(MAX_TRANSACTIONS):
            purged = await self._store.purge_idempotency_keys(KEYS_PAGE)
            keys += purged
            IDEMPOTENCY_KEYS_PURGED.inc(purged)
            if purged < KEYS_PAGE:
                break
        return keys
