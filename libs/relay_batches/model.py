"""Job and webhook-delivery statuses, their terminal sets and allowed transitions, and
the batch object as the API shows it.

The transition tables are the one statement of which status may follow which: the
ledger's guarded updates take their allowed-from sets from :func:`allowed_from` and
:func:`delivery_allowed_from`, and migrations CHECK exactly these values (a unit test
compares them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

import orjson


class JobStatus(StrEnum):
    """Every status a batch can have (``batches.status`` CHECKs the same values)."""

    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    EXPIRED = "expired"


class DeliveryStatus(StrEnum):
    """Every status of a completion-webhook delivery (``webhook_deliveries.status``)."""

    SENDING = "sending"
    POSTING = "posting"
    DELIVERED = "delivered"
    REFUSED = "refused"
    FAILED = "failed"
    UNKNOWN = "unknown"
    RETRYING = "retrying"


S = TypeVar("S", bound=StrEnum)

JOB_INITIAL: frozenset[JobStatus] = frozenset({JobStatus.QUEUED, JobStatus.SCHEDULED})

# Which status each job status may move to, and nothing else: queued and running jobs
# end by failing, being canceled or expiring (past their completion window), a running
# job completes when every row has an outcome, a cron template (scheduled) only ever
# ends by cancel; its runs are new jobs. A queued or running job may be paused (no rows
# are released; the rows already released still finish and count, so a paused job may
# complete, or fail on its budget) and resumes as queued: a dispatcher claims it again
# in its workspace's turn, from where it left off. Until then the rows that were in
# flight at its pause still count, so a resumed job may complete while queued.
_ENDS_OF_LIVE = frozenset({JobStatus.FAILED, JobStatus.CANCELED, JobStatus.EXPIRED})
JOB_STATUS_TRANSITIONS: Mapping[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: _ENDS_OF_LIVE | {JobStatus.RUNNING, JobStatus.PAUSED, JobStatus.COMPLETED},
    JobStatus.SCHEDULED: frozenset({JobStatus.CANCELED}),
    JobStatus.RUNNING: _ENDS_OF_LIVE | {JobStatus.COMPLETED, JobStatus.PAUSED},
    JobStatus.PAUSED: _ENDS_OF_LIVE | {JobStatus.COMPLETED, JobStatus.QUEUED},
    JobStatus.COMPLETED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELED: frozenset(),
    JobStatus.EXPIRED: frozenset(),
}

DELIVERY_INITIAL: frozenset[DeliveryStatus] = frozenset({DeliveryStatus.SENDING})

# A claim is taken ``sending`` (nothing sent yet: a dead holder's claim is taken over and
# POSTed) and becomes ``posting`` right before the POST (it may have been sent: it is never
# POSTed again). It ends once, however the POST went, or fails unsent (given up). A
# ``posting`` claim whose holder went silent past its expiry is ``unknown``: its holder,
# if alive after all, still records how the POST went, fenced by its claim number.
# An attempt that did not deliver becomes ``retrying`` instead of ``failed`` or
# ``refused`` while the workspace's retries allow another (``next_attempt_at``); a
# ``retrying`` delivery is claimed again (``sending``) when due. A redelivery asked for
# through the API re-arms a delivery that ended, however it ended, as ``retrying`` due
# at once. Every POST is also one row of ``webhook_attempts`` (the delivery log).
_POST_ENDS = frozenset({DeliveryStatus.DELIVERED, DeliveryStatus.REFUSED, DeliveryStatus.FAILED})
_REARM = frozenset({DeliveryStatus.RETRYING})
DELIVERY_STATUS_TRANSITIONS: Mapping[DeliveryStatus, frozenset[DeliveryStatus]] = {
    DeliveryStatus.SENDING: frozenset({DeliveryStatus.POSTING, DeliveryStatus.FAILED}),
    DeliveryStatus.POSTING: _POST_ENDS | {DeliveryStatus.UNKNOWN, DeliveryStatus.RETRYING},
    DeliveryStatus.DELIVERED: _REARM,
    DeliveryStatus.REFUSED: _REARM,
    DeliveryStatus.FAILED: _REARM,
    DeliveryStatus.UNKNOWN: _POST_ENDS | _REARM,
    DeliveryStatus.RETRYING: frozenset({DeliveryStatus.SENDING, DeliveryStatus.FAILED}),
}


def _terminal(transitions: Mapping[S, frozenset[S]]) -> frozenset[S]:
    return frozenset(s for s, targets in transitions.items() if not targets)


TERMINAL: frozenset[JobStatus] = _terminal(JOB_STATUS_TRANSITIONS)
# A delivery is settled when no attempt is under way or due: only a redelivery asked for
# through the API moves it on.
DELIVERY_SETTLED: frozenset[DeliveryStatus] = frozenset(
    s for s, targets in DELIVERY_STATUS_TRANSITIONS.items() if targets <= _REARM
)


def allowed_from(target: JobStatus) -> list[JobStatus]:
    """The job statuses that may move to ``target``, in enum order (a SQL array)."""
    return [s for s in JobStatus if target in JOB_STATUS_TRANSITIONS[s]]


def delivery_allowed_from(target: DeliveryStatus) -> list[DeliveryStatus]:
    """The delivery statuses that may move to ``target``, in enum order (a SQL array)."""
    return [s for s in DeliveryStatus if target in DELIVERY_STATUS_TRANSITIONS[s]]


CANCELABLE: frozenset[JobStatus] = frozenset(allowed_from(JobStatus.CANCELED))
# The error of a row a budget kept from running: one never released (the aggregator's
# budget settle), or one released that no row-worker had started (it withholds them).
BUDGET_ROW_ERROR = "budget_exceeded: the batch reached its budget before this row was released"
BUDGET_HELD_ERROR = "budget_exceeded: the batch reached its budget before this row started"
PAUSABLE: frozenset[JobStatus] = frozenset(allowed_from(JobStatus.PAUSED))
# The ends that stop a job's rows where they are (rows without an outcome never run, and
# outcomes arriving later are discarded): each is announced with ``job.canceled``.
STOPPED: frozenset[JobStatus] = frozenset({JobStatus.CANCELED, JobStatus.EXPIRED})


# Costs and rates are shown to this many significant digits: a row may cost a millionth
# of a cent, and a float sum of many rows carries noise in its last digits.
SHOWN_DIGITS = 12


def shown(value: float, digits: int = SHOWN_DIGITS) -> float:
    """``value`` rounded to ``digits`` significant digits (how costs and rates are shown)."""
    return float(f"{value:.{digits}g}")


# The aggregator measures a job's rate over windows of at least this long; a window
# older than twice that without a new measurement means the job slowed down.
RATE_WINDOW_S = 5.0
RATE_DIGITS = 4


def recent_rate(
    measured: float | None,
    window_at: datetime | None,
    window_done: int,
    done: int,
    now: datetime | None = None,
) -> float | None:
    """Rows per second lately: the last window's measurement (``measured``), or the rate
    since the current window began (``window_at`` with ``window_done`` rows done) when
    there is none yet or it is stale; None before a second of measuring."""
    if window_at is None:
        return measured
    elapsed = ((now or datetime.now(UTC)) - window_at).total_seconds()
    if measured is not None and elapsed < 2 * RATE_WINDOW_S:
        return measured
    if elapsed < 1.0:
        return measured
    return max(0, done - window_done) / elapsed


def iso(ts: datetime | None) -> str | None:
    """API timestamp: ISO 8601 UTC to the second with a ``Z``."""
    if ts is None:
        return None
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Job:
    """One row of the ``batches`` table, as the services need it."""

    id: str
    workspace_id: str
    name: str
    model: str
    priority: int
    status: JobStatus
    total: int
    completed: int
    failed: int
    dead_letter: int
    webhook_url: str | None
    cron: str | None
    next_run_at: datetime | None
    template_id: str | None
    rows_batch_id: str
    params: str
    error: str | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    expires_at: datetime | None = None
    metadata: str | None = None
    retry_of: str | None = None
    retries: tuple[str, ...] = ()
    cost_usd: float = 0.0
    budget_usd: float | None = None
    budget_exceeded_at: datetime | None = None
    rate_rows_per_s: float | None = None
    rate_window_at: datetime | None = None
    rate_window_done: int = 0
    pauses: int = 0  # how many times it was paused (slices carry it, see row_worker.controls)
    endpoint: str = "/v1/chat/completions"  # the OpenAI endpoint its rows are bodies of
    cached_tokens: int = 0  # prompt tokens read from the providers' prompt caches
    all_realtime_usd: float = 0.0  # its answered rows' tokens at the realtime reference
    # Answered rows and their cost per lane (migration 0032), answers discarded because
    # their row had moved lanes, and the plan its dispatcher chose (JSON text, or None).
    rows_batch: int = 0
    rows_flex: int = 0
    rows_realtime: int = 0
    cost_batch_usd: float = 0.0
    cost_flex_usd: float = 0.0
    cost_realtime_usd: float = 0.0
    late_answers: int = 0
    lane_plan: str | None = None
    traceparent: str | None = None  # its W3C trace context, if traced (relay_batches.tracing)

    @classmethod
    def from_record(cls, record: Any) -> Job:
        """Build from an asyncpg record of ``SELECT * FROM batches`` (extra keys ignored)."""
        values = {name: record[name] for name in cls.__dataclass_fields__}
        values["status"] = JobStatus(values["status"])
        values["retries"] = tuple(values["retries"] or ())
        return cls(**values)

    @property
    def done(self) -> int:
        """Rows with an outcome."""
        return self.completed + self.failed

    def rows_per_s(self, now: datetime | None = None) -> float | None:
        """The job's recent rate while it runs, to 4 significant digits (None otherwise,
        or before there is one)."""
        if self.status is not JobStatus.RUNNING:
            return None
        rate = recent_rate(
            self.rate_rows_per_s, self.rate_window_at, self.rate_window_done, self.done, now
        )
        return None if rate is None else shown(rate, RATE_DIGITS)

    def eta_s(self, now: datetime | None = None) -> int | None:
        """Seconds until every row has an outcome at the recent rate as shown, while it runs."""
        rate = self.rows_per_s(now)
        if not rate:
            return None
        return math.ceil(max(0, self.total - self.done) / rate)

    def to_api(self, now: datetime | None = None) -> dict[str, Any]:
        """The native batch object of docs/api/native.md (rate and ETA as of ``now``, one
        instant for both)."""
        now = now or datetime.now(UTC)
        return {
            "id": self.id,
            "object": "batch",
            "status": self.status,
            "name": self.name,
            "model": self.model,
            "priority": self.priority,
            "total": self.total,
            "completed": self.completed,
            "failed": self.failed,
            "dead_letter": self.dead_letter,
            "created_at": iso(self.created_at),
            "started_at": iso(self.started_at),
            "completed_at": iso(self.completed_at),
            "error": self.error,
            "cron": self.cron,
            "next_run_at": iso(self.next_run_at),
            "template_id": self.template_id,
            "endpoint": self.endpoint,
            "params": orjson.loads(self.params),
            "expires_at": iso(self.expires_at),
            "metadata": None if self.metadata is None else orjson.loads(self.metadata),
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "cached_tokens": self.cached_tokens,
            },
            "cost_usd": shown(self.cost_usd),
            "saving": self.saving(),
            "lanes": self.lanes(),
            "late_answers": self.late_answers,
            "plan": None if self.lane_plan is None else orjson.loads(self.lane_plan),
            "budget_usd": self.budget_usd,
            "retry_of": self.retry_of,
            "retries": list(self.retries),
            "rows_per_s": self.rows_per_s(now),
            "eta_s": self.eta_s(now),
        }

    def webhook_body(self) -> dict[str, Any]:
        """The completion webhook payload (docs/guides/webhooks.md)."""
        return {
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "total": self.total,
            "completed": self.completed,
            "failed": self.failed,
            "dead_letter": self.dead_letter,
            "completed_at": iso(self.completed_at),
            "cost_usd": shown(self.cost_usd),
            "cached_tokens": self.cached_tokens,
            "saving": self.saving(),
            "lanes": self.lanes(),
        }

    def lanes(self) -> dict[str, dict[str, Any]]:
        """What each lane answered and cost: ``{lane: {rows, cost_usd}}`` for batch, flex
        and realtime (rows recorded before lanes were recorded count in none)."""
        return {
            "batch": {"rows": self.rows_batch, "cost_usd": shown(self.cost_batch_usd)},
            "flex": {"rows": self.rows_flex, "cost_usd": shown(self.cost_flex_usd)},
            "realtime": {"rows": self.rows_realtime, "cost_usd": shown(self.cost_realtime_usd)},
        }

    def saving(self) -> dict[str, Any]:
        """What the job saved against all-realtime: its answered rows' tokens priced at
        each one's realtime reference (``all_realtime_usd``), less what they cost
        (``saved_usd``; ``saved_fraction`` of the realtime cost, None while it is 0)."""
        realtime = self.all_realtime_usd
        # to a billionth of a dollar: sums of the same rows in another order differ by less
        saved = round(realtime - self.cost_usd, 9) if realtime > 0 else 0.0
        return {
            "all_realtime_usd": shown(realtime),
            "saved_usd": shown(saved),
            "saved_fraction": shown(saved / realtime) if realtime > 0 else None,
        }
