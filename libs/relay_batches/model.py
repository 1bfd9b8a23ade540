"""The batch (job) as the API shows it: status names, terminal sets, the batch object."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import orjson


class Status(StrEnum):
    """Every status a batch can have (a CHECK constraint in the ledger says the same)."""

    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"


TERMINAL: frozenset[str] = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELED})
CANCELABLE: frozenset[str] = frozenset({Status.QUEUED, Status.RUNNING, Status.SCHEDULED})


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
    status: str
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

    @classmethod
    def from_record(cls, record: Any) -> Job:
        """Build from an asyncpg record of ``SELECT * FROM batches`` (extra keys ignored)."""
        return cls(**{name: record[name] for name in cls.__dataclass_fields__})

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
