"""Job and webhook-delivery statuses, their terminal sets and allowed transitions, and
the batch object as the API shows it.

The transition tables are the one statement of which status may follow which: the
ledger's guarded updates take their allowed-from sets from :func:`allowed_from` and
:func:`delivery_allowed_from`, and migrations CHECK exactly these values (a unit test
compares them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

import orjson


class JobStatus(StrEnum):
    """Every status a batch can have (``batches.status`` CHECKs the same values)."""

    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
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


S = TypeVar("S", bound=StrEnum)

JOB_INITIAL: frozenset[JobStatus] = frozenset({JobStatus.QUEUED, JobStatus.SCHEDULED})

# Which status each job status may move to, and nothing else: queued and running jobs
# end by failing, being canceled or expiring (past their completion window), a running
# job completes when every row has an outcome, a cron template (scheduled) only ever
# ends by cancel; its runs are new jobs.
_ENDS_OF_LIVE = frozenset({JobStatus.FAILED, JobStatus.CANCELED, JobStatus.EXPIRED})
JOB_STATUS_TRANSITIONS: Mapping[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: _ENDS_OF_LIVE | {JobStatus.RUNNING},
    JobStatus.SCHEDULED: frozenset({JobStatus.CANCELED}),
    JobStatus.RUNNING: _ENDS_OF_LIVE | {JobStatus.COMPLETED},
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
_POST_ENDS = frozenset({DeliveryStatus.DELIVERED, DeliveryStatus.REFUSED, DeliveryStatus.FAILED})
DELIVERY_STATUS_TRANSITIONS: Mapping[DeliveryStatus, frozenset[DeliveryStatus]] = {
    DeliveryStatus.SENDING: frozenset({DeliveryStatus.POSTING, DeliveryStatus.FAILED}),
    DeliveryStatus.POSTING: _POST_ENDS | {DeliveryStatus.UNKNOWN},
    DeliveryStatus.DELIVERED: frozenset(),
    DeliveryStatus.REFUSED: frozenset(),
    DeliveryStatus.FAILED: frozenset(),
    DeliveryStatus.UNKNOWN: _POST_ENDS,
}


def _terminal(transitions: Mapping[S, frozenset[S]]) -> frozenset[S]:
    return frozenset(s for s, targets in transitions.items() if not targets)


TERMINAL: frozenset[JobStatus] = _terminal(JOB_STATUS_TRANSITIONS)
DELIVERY_TERMINAL: frozenset[DeliveryStatus] = _terminal(DELIVERY_STATUS_TRANSITIONS)


def allowed_from(target: JobStatus) -> list[JobStatus]:
    """The job statuses that may move to ``target``, in enum order (a SQL array)."""
    return [s for s in JobStatus if target in JOB_STATUS_TRANSITIONS[s]]


def delivery_allowed_from(target: DeliveryStatus) -> list[DeliveryStatus]:
    """The delivery statuses that may move to ``target``, in enum order (a SQL array)."""
    return [s for s in DeliveryStatus if target in DELIVERY_STATUS_TRANSITIONS[s]]


CANCELABLE: frozenset[JobStatus] = frozenset(allowed_from(JobStatus.CANCELED))
# The ends that stop a job's rows where they are (rows without an outcome never run, and
# outcomes arriving later are discarded): each is announced with ``job.canceled``.
STOPPED: frozenset[JobStatus] = frozenset({JobStatus.CANCELED, JobStatus.EXPIRED})


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

    @classmethod
    def from_record(cls, record: Any) -> Job:
        """Build from an asyncpg record of ``SELECT * FROM batches`` (extra keys ignored)."""
        values = {name: record[name] for name in cls.__dataclass_fields__}
        values["status"] = JobStatus(values["status"])
        return cls(**values)

    def to_api(self) -> dict[str, Any]:
        """The batch object of API.md."""
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
            "params": orjson.loads(self.params),
            "expires_at": iso(self.expires_at),
            "metadata": None if self.metadata is None else orjson.loads(self.metadata),
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
            },
        }

    def webhook_body(self) -> dict[str, Any]:
        """The completion webhook payload of API.md."""
        return {
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "total": self.total,
            "completed": self.completed,
            "failed": self.failed,
            "dead_letter": self.dead_letter,
            "completed_at": iso(self.completed_at),
        }
