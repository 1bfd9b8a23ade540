"""In-memory fakes with the real interfaces (the services' store protocols), and the sample
values the unit tests build them from."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import UTC, datetime

from relay_batches.errors import TransientError
from relay_batches.ledger.deliveries import Claim, Deferred
from relay_batches.messages import JobEvent
from relay_batches.model import DeliveryStatus, Job, JobStatus
from relay_batches.services.notifier.core import PostResult

HOOK = "https://my-app.example/relay-webhook"

BATCH = Job(
    id="9f2c1b7e4a8d4e51b0c6d3f2a1e5c7b9",
    workspace_id="ws1",
    name="Review sentiment — October",
    model="gpt-4o-mini",
    priority=5,
    status=JobStatus.COMPLETED,
    total=3,
    completed=2,
    failed=1,
    dead_letter=1,
    webhook_url=HOOK,
    cron=None,
    next_run_at=None,
    template_id=None,
    rows_batch_id="9f2c1b7e4a8d4e51b0c6d3f2a1e5c7b9",
    params="{}",
    error=None,
    created_at=datetime(2026, 10, 4, 9, 12, 44, tzinfo=UTC),
    started_at=datetime(2026, 10, 4, 9, 12, 45, tzinfo=UTC),
    completed_at=datetime(2026, 10, 4, 9, 20, 1, 123456, tzinfo=UTC),
)

EVENT = JobEvent(BATCH.id, JobStatus.COMPLETED, 3, 2, 1)


@dataclass
class FakeDeliveryStore:
    """The notifier's ledger (:class:`RecoveryStore`) in memory: jobs and webhook deliveries;
    a delivery can be claimed once; ``expired`` claims are handed out to a taker-over,
    ``lost`` ones (expired while posting) are marked unknown, ``waiting`` ones are
    deferred (by batch id: the URL), and the first
    ``finish_failures`` records fail as a database outage would."""

    batches: dict[str, Job] = field(default_factory=dict)
    claims: dict[str, str] = field(default_factory=dict)
    finished: list[tuple[str, str, int | None, str | None]] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    finish_failures: int = 0
    posting: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)

    async def batch(self, batch_id: str) -> Job | None:
        return self.batches.get(batch_id)

    async def claim(self, batch_id: str, url: str, message_id: str) -> Claim | None:
        if batch_id in self.claims:
            return None
        self.claims[batch_id] = url
        return Claim(batch_id, 1)

    async def signing_secret(self, workspace_id: str) -> str:
        return SECRET

    async def defer(self, batch_id: str, url: str, message_id: str) -> bool:
        if batch_id in self.claims or batch_id in self.waiting:
            return False
        self.waiting[batch_id] = url
        return True

    async def deferred(self, limit: int, per_receiver: int) -> list[Deferred]:
        taken = list(self.waiting.items())[:limit]
        return [Deferred(b, url, self.batches[b].workspace_id) for b, url in taken]

    async def claim_deferred(self, batch_id: str) -> Claim | None:
        url = self.waiting.pop(batch_id, None)
        if url is None:
            return None
        self.claims[batch_id] = url
        return Claim(batch_id, 1)

    async def start_post(self, claim: Claim) -> bool:
        self.posting.append(claim.batch_id)
        return True

    async def mark_unknown(self) -> list[str]:
        lost, self.lost = self.lost, []
        return lost

    async def reclaim_expired(self, limit: int = 20) -> list[Claim]:
        taken, self.expired = self.expired[:limit], self.expired[limit:]
        return [Claim(batch_id, 2) for batch_id in taken]

    async def finish(
        self, claim: Claim, status: DeliveryStatus, status_code: int | None, error: str | None
    ) -> bool:
        if self.finish_failures:
            self.finish_failures -= 1
            raise TransientError("database unavailable")
        self.finished.append((claim.batch_id, status, status_code, error))
        return True


@dataclass
class FakePost:
    """Records every POST and answers with a fixed result."""

    result: PostResult = field(default_factory=lambda: PostResult(204))
    posts: list[tuple[str, bytes]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    async def __call__(self, url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        self.posts.append((url, body))
        self.headers.append(headers)
        return self.result


SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()
