"""The offload ledger's vocabulary: the states of a provider batch and of an
offloaded row, how a deployment gathers (:class:`Gathering`), the records read back, and
:class:`PoolStore`, the pool its parts (intake, provider batches, settling) share."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import asyncpg

from relay_batches.model import TERMINAL

log = logging.getLogger("relay.offloader")

INTAKE_STEP = 10_000
# Rows taken in since offload_rows' statistics were last read: past this, intake reads
# them again (ANALYZE samples a bounded number of rows: about a tenth of a second at any
# size). Autovacuum comes a minute or more later; meanwhile statistics taken while the
# table held a few finished rows say no row is pending, and the gather's update then
# joins its 20,000 picked rows to the pending ones by a nested loop (2.3 minutes
# measured, instead of a third of a second).
ANALYZE_AFTER_ROWS = 5_000
DROP_WITHIN_S = 3600.0


class BatchState(StrEnum):
    """The states of one provider batch (``offload_batches.state``)."""

    RECORDED = "recorded"
    CREATING = "creating"
    SUBMITTED = "submitted"
    CANCELING = "canceling"
    ENDED = "ended"
    SETTLED = "settled"


class RowState(StrEnum):
    """The states of one offloaded row (``offload_rows.state``)."""

    PENDING = "pending"
    SUBMITTED = "submitted"
    DONE = "done"
    FORWARD = "forward"
    FORWARDED = "forwarded"
    DROPPED = "dropped"


@dataclass(frozen=True, slots=True)
class Gathering:
    """How one batch deployment cuts its pending rows into provider batches.

    ``line_extra`` is added to each row's stored request size to bound its line in the
    provider's input file (the custom id, the deployment's model and params, the
    envelope); ``max_bytes`` is the budget of those bounds. A job's rows go in a
    provider batch only while its deadline is at least ``window_s + margin_s`` away (the
    dispatcher's rule when it offloaded the job; a job paused long since may no longer
    leave that): the others go realtime.
    """

    deployment: str
    max_rows: int
    max_bytes: int
    linger_s: float
    line_extra: int = 512
    window_s: float = 86_400.0
    margin_s: float = 3600.0
    late_step: int = INTAKE_STEP


@dataclass(frozen=True, slots=True)
class OffloadBatch:
    """One provider batch as its record holds it."""

    id: int
    deployment: str
    state: BatchState
    provider_id: str | None
    input_file_id: str | None
    output_file_id: str | None
    error_file_id: str | None
    rows: int
    bytes: int
    created_at: datetime
    polls: int
    error: str | None


@dataclass(frozen=True, slots=True)
class OffloadLine:
    """One row of a provider batch with what its line is built from."""

    batch_id: str
    row_index: int
    request: str  # the row's stored chat request (JSON)
    params: str  # the job's params (JSON)


@dataclass(frozen=True, slots=True)
class ForwardRow:
    """A row to publish realtime, with what its slice carries of its job."""

    batch_id: str
    row_index: int
    request: str
    model: str
    params: str
    expires_at: datetime | None


# Publishes rows as ordinary realtime rows; returns once the broker confirmed them.
PublishForward = Callable[[list["ForwardRow"]], Awaitable[None]]

BATCH_COLUMNS = (
    "id, deployment, state, provider_id, input_file_id, output_file_id, error_file_id,"
    " rows, bytes, created_at, polls, error"
)
ENDED = [str(s) for s in TERMINAL]


def forward_or_drop(ended: str) -> str:
    """A row's state when it is to go realtime: dropped if its job (``b``) ended (the
    parameter ``ended`` holds the ended statuses), as nobody forwards an ended job's rows."""
    return (
        f"CASE WHEN b.status = ANY({ended}::text[])"
        f" THEN '{RowState.DROPPED}' ELSE '{RowState.FORWARD}' END"
    )


# A provider batch's ($1) rows still in state $2 go realtime (dropped if their job ended:
# $3 the ended statuses): a stalled or moved batch, and one that ended without them.
FORWARD_SUBMITTED = (
    f"UPDATE offload_rows o SET state = {forward_or_drop('$3')}"
    " FROM batches b WHERE o.provider_batch = $1 AND o.state = $2 AND b.id = o.batch_id"
)


def batch_of(record: asyncpg.Record) -> OffloadBatch:
    """An :class:`OffloadBatch` of a record read as ``BATCH_COLUMNS`` lists them."""
    values = list(record)
    values[2] = BatchState(values[2])
    return OffloadBatch(*values)


class PoolStore:
    """A part of :class:`~relay_batches.ledger.offload.store.OffloadStore`: its pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._unanalyzed = 0  # rows taken in since this store last analyzed offload_rows

    @property
    def pool(self) -> asyncpg.Pool:
        """The ledger's pool (for reads beyond the offload tables: lane rates)."""
        return self._pool
