"""In-memory fakes with the real interfaces (the services' store protocols), and the sample
values the unit tests build them from."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from relay_batches.errors import TransientError
from relay_batches.ledger.deliveries import Attempt, Claim, Deferred, Probe
from relay_batches.ledger.dispatch import RunningJob, StalledJob
from relay_batches.ledger.released_rows import ByteWindow
from relay_batches.ledger.result_pages import AnsweredRow
from relay_batches.ledger.webhook_endpoints import EndpointTarget
from relay_batches.messages import JobEvent, SliceMessage
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

# Stored tool calls (rows recorded before replies were checked may hold them) that show
# no tool call at all.
UNUSABLE_STORED_TOOL_CALLS = (
    "[1]",
    "not json",
    '{"id":"call_1"}',
    '[{"function":"x"}]',
    '[{"id":7,"type":"function","function":{"name":"f","arguments":"{}"}}]',
    '[{"id":"c","type":"function","function":{"name":9,"arguments":"{}"}}]',
)

OUTCOME_FIELDS = (
    "content",
    "error",
    "tool_calls",
    "finish_reason",
    "model",
    "prompt_tokens",
    "completion_tokens",
    "attempts",
    "dead_letter",
    "deployment",
)


def answered_row(index: int, custom_id: str, **outcome: Any) -> AnsweredRow:
    """An input row whose outcome holds ``outcome`` (and ``done``), every other outcome
    field None; not done unless told."""
    values: dict[str, Any] = {**dict.fromkeys(OUTCOME_FIELDS), "done": False, **outcome}
    return AnsweredRow(index, custom_id, **values)


@dataclass
class FakeDeliveryStore:
    """The notifier's ledger (:class:`RecoveryStore`) in memory: jobs and webhook deliveries;
    a delivery can be claimed once; ``expired`` claims are handed out to a taker-over,
    ``lost`` ones (expired while posting) are marked unknown, ``waiting`` ones are
    deferred (by batch id: the URL), and the first
    ``finish_failures`` records fail as a database outage would. Each POST is an
    attempt (``attempts``: batch id → how many) allowed ``max_attempts`` within
    ``retry_window_s``; a delivery recorded ``retrying`` is due at once (listed by
    :meth:`deferred` again), its delay kept in ``retries``."""

    batches: dict[str, Job] = field(default_factory=dict)
    claims: dict[str, str] = field(default_factory=dict)
    finished: list[tuple[str, str, int | None, str | None]] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    finish_failures: int = 0
    posting: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)
    max_attempts: int = 1
    retry_window_s: float = 86400.0
    redelivery: bool = False
    attempts: dict[str, int] = field(default_factory=dict)
    retrying: dict[str, str] = field(default_factory=dict)
    retries: list[tuple[str, int, float]] = field(default_factory=list)
    durations: list[int | None] = field(default_factory=list)
    probes: int = 0

    async def job(self, batch_id: str) -> Job | None:
        return self.batches.get(batch_id)

    async def claim(self, batch_id: str, url: str, message_id: str) -> Claim | None:
        if batch_id in self.claims:
            return None
        self.claims[batch_id] = url
        return Claim(batch_id, 1)

    async def signing_secret(self, workspace_id: str) -> str:
        return SECRET

    async def fan_out(self, job: Job) -> int:
        """No webhook endpoints here (their deliveries are the ledger's: integration)."""
        return 0

    async def endpoint_target(self, batch_id: str, endpoint_id: str) -> EndpointTarget | None:
        return None

    async def defer(self, batch_id: str, url: str, message_id: str) -> bool:
        if batch_id in self.claims or batch_id in self.waiting:
            return False
        self.waiting[batch_id] = url
        return True

    async def deferred(
        self,
        limit: int,
        per_receiver: int,
        skip_workspaces: Sequence[str] = (),
        skip_receivers: Sequence[tuple[str, str]] = (),
    ) -> list[Deferred]:
        due = {**self.waiting, **self.retrying}
        listed = [Deferred(b, url, self.batches[b].workspace_id) for b, url in due.items()]
        return [
            d
            for d in listed
            if d.workspace_id not in skip_workspaces
            and (d.workspace_id, d.url) not in skip_receivers
        ][:limit]

    async def hand_back(self, claim: Claim) -> bool:
        url = self.claims.pop(claim.batch_id, None) or self.batches[claim.batch_id].webhook_url
        self.waiting[claim.batch_id] = url or ""
        return True

    async def claim_deferred(self, batch_id: str, endpoint_id: str = "") -> Claim | None:
        url = self.waiting.pop(batch_id, None) or self.retrying.pop(batch_id, None)
        if url is None:
            return None
        self.claims[batch_id] = url
        return Claim(batch_id, 1)

    async def probe(
        self,
        since: datetime | None,
        skip_workspaces: Sequence[str] = (),
        skip_receivers: Sequence[tuple[str, str]] = (),
    ) -> Probe:
        """Due whenever something waits (the fake keeps no times), as the notifier's
        pass polled before it had a probe."""
        self.probes += 1
        return Probe(datetime.now(UTC), bool(self.waiting or self.retrying))

    async def start_post(self, claim: Claim) -> Attempt | None:
        self.posting.append(claim.batch_id)
        number = self.attempts.get(claim.batch_id, 0) + 1
        self.attempts[claim.batch_id] = number
        return Attempt(number, self.max_attempts, self.retry_window_s, self.redelivery)

    async def mark_unknown(self) -> list[str]:
        lost, self.lost = self.lost, []
        return lost

    async def reclaim_expired(self, limit: int = 20) -> list[Claim]:
        taken, self.expired = self.expired[:limit], self.expired[limit:]
        return [Claim(batch_id, 2) for batch_id in taken]

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
        if self.finish_failures:
            self.finish_failures -= 1
            raise TransientError("database unavailable")
        self.finished.append((claim.batch_id, status, status_code, error))
        self.durations.append(duration_ms)
        if status == DeliveryStatus.RETRYING:
            assert retry_in_s is not None
            self.retries.append((claim.batch_id, self.attempts[claim.batch_id], retry_in_s))
            self.retrying[claim.batch_id] = self.claims.pop(claim.batch_id)
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


# --- the dispatcher ---------------------------------------------------------------------

OWNER = "dispatcher-test"
LEASE_S = 30.0


def messages_json(index: int) -> str:
    return f'[{{"role":"user","content":"row {index}"}}]'


def job(
    job_id: str = "job1",
    *,
    total: int = 100,
    priority: int = 5,
    model: str = "gpt-4o-mini",
    completed: int = 0,
    failed: int = 0,
    dispatched_upto: int = 0,
    params: str = '{"temperature":0}',
    workspace: str | None = None,
    budget_exceeded_at: datetime | None = None,
) -> RunningJob:
    return RunningJob(
        id=job_id,
        model=model,
        priority=priority,
        total=total,
        completed=completed,
        failed=failed,
        status="running",
        dispatched_upto=dispatched_upto,
        rows_batch_id=f"rows-{job_id}",
        params=params,
        # Each job its own workspace unless told: no sharing between them.
        workspace_id=f"ws-{job_id}" if workspace is None else workspace,
        budget_exceeded_at=budget_exceeded_at,
    )


@dataclass
class FakeDispatchStore:
    """The dispatcher's ledger in memory, with every call recorded."""

    queued: list[RunningJob] = field(default_factory=list)
    expired: list[RunningJob] = field(default_factory=list)
    alive: dict[str, RunningJob] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    calls: list[tuple] = field(default_factory=list)
    fetches: list[tuple[str, int, int]] = field(default_factory=list)
    advanced: list[tuple[str, int]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    offloaded: list[tuple[str, int, str]] = field(default_factory=list)
    released: list[list[str]] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, set[int]] = field(default_factory=dict)
    stalled: dict[str, int | None] = field(default_factory=dict)
    row_bytes: dict[int, int] = field(default_factory=dict)  # a size other than the text's
    byte_reads: list[tuple[int, int, int]] = field(default_factory=list)  # flying, coming
    # Per running job with an outcome recorded, seconds since the aggregator recorded one.
    silences: dict[str, float] = field(default_factory=dict)
    returned: dict[str, list[int]] = field(default_factory=dict)  # rows handed back

    def _take(
        self, pool: list[RunningJob], limit: int, source: list[RunningJob] | None = None
    ) -> list[RunningJob]:
        taken = sorted(pool, key=lambda j: -j.priority)[:limit]
        for j in taken:
            (pool if source is None else source).remove(j)
            self.alive[j.id] = j
            self.totals[j.rows_batch_id] = j.total
        return taken

    async def claim_queued(
        self,
        owner: str,
        limit: int,
        lease_s: float,
        per_workspace: int = 0,
        floors: dict[str, int] | None = None,
    ) -> list[RunningJob]:
        self.calls.append(("claim_queued", owner, limit, lease_s))
        below = {
            j.id for j in self.queued if j.priority < (floors or {}).get(j.workspace_id, j.priority)
        }
        return self._take([j for j in self.queued if j.id not in below], limit, self.queued)

    async def claim_outranking(
        self,
        owner: str,
        floors: dict[str, int],
        limit: int,
        lease_s: float,
        per_workspace: int = 0,
    ) -> list[RunningJob]:
        self.calls.append(("claim_outranking", owner, dict(floors), limit))
        above = [
            j
            for j in self.queued
            if j.workspace_id in floors and j.priority > floors[j.workspace_id]
        ]
        taken = self._take(above, limit)
        for j in taken:
            self.queued.remove(j)
        return taken

    async def claim_expired(self, owner: str, limit: int, lease_s: float) -> list[RunningJob]:
        self.calls.append(("claim_expired", owner, limit, lease_s))
        return self._take(self.expired, limit)

    async def renew(self, owner: str, job_ids: list[str], lease_s: float) -> list[RunningJob]:
        self.calls.append(("renew", owner, sorted(job_ids), lease_s))
        return [self.alive[i] for i in job_ids if i in self.alive]

    async def release(self, owner: str, job_ids: list[str]) -> None:
        self.released.append(sorted(job_ids))

    async def fetch_rows(
        self, job_id: str, rows_batch_id: str, start: int, end: int
    ) -> list[tuple[int, str]]:
        self.fetches.append((rows_batch_id, start, end))
        assert 0 <= start < end <= self.totals[rows_batch_id]
        done = self.outcomes.get(job_id, set())
        return [(i, messages_json(i)) for i in range(start, end) if i not in done]

    def size(self, index: int) -> int:
        return self.row_bytes.get(index, len(messages_json(index)))

    async def byte_window(
        self, job_id: str, rows_batch_id: str, settled_below: int, upto: int, end: int
    ) -> ByteWindow:
        self.byte_reads.append((upto - min(settled_below, upto), upto, end))
        done = self.outcomes.get(job_id, set())
        flying = [i for i in range(min(settled_below, upto), upto) if i not in done]
        coming = [(i, self.size(i)) for i in range(upto, end) if i not in done]
        return ByteWindow(sum(map(self.size, flying)), min(flying, default=None), coming)

    async def claim_stalled(
        self,
        owner: str,
        job_ids: list[str],
        stall_s: float,
        settled: Mapping[str, int] | None = None,
    ) -> list[StalledJob]:
        self.calls.append(("claim_stalled", owner, sorted(job_ids), stall_s))
        # Only the jobs asked about have their stall clock restarted.
        return [StalledJob(i, self.stalled.pop(i)) for i in job_ids if i in self.stalled]

    async def recording_silences(self) -> dict[str, float]:
        return dict(self.silences)

    async def unfinished_rows(self, job_id: str, start: int, end: int) -> list[int]:
        done = self.outcomes.get(job_id, set())
        return [i for i in range(start, end) if i not in done]

    async def fetch_rows_at(
        self, job_id: str, rows_batch_id: str, indexes: list[int]
    ) -> list[tuple[int, str]]:
        done = self.outcomes.get(job_id, set())
        return [(i, messages_json(i)) for i in sorted(indexes) if i not in done]

    async def advance(self, owner: str, job_id: str, upto: int) -> bool:
        assert owner == OWNER
        self.advanced.append((job_id, upto))
        alive = self.alive.get(job_id)
        stopped = alive is not None and alive.budget_stopped  # the ledger refuses those too
        return job_id not in self.lost and not stopped

    async def fail(self, job_id: str, error: str) -> bool:
        self.failed.append((job_id, error))
        return True

    async def take_returned(self, owner: str, job_id: str) -> list[tuple[int, str]]:
        self.calls.append(("take_returned", owner, job_id))
        done = self.outcomes.get(job_id, set())
        rows = sorted(i for i in self.returned.pop(job_id, []) if i not in done)
        if job_id in self.alive:  # the ledger says none wait any more
            self.alive[job_id] = replace(self.alive[job_id], returned=False)
        return [(i, messages_json(i)) for i in rows]

    async def offload(self, owner: str, job_id: str, total: int, deployment: str) -> bool:
        assert owner == OWNER
        self.offloaded.append((job_id, total, deployment))
        return job_id not in self.lost


@dataclass
class Recorder:
    """Fake publishers: every row task with its priority, every announced event."""

    tasks: list[tuple[SliceMessage, int]] = field(default_factory=list)
    events: list[JobEvent] = field(default_factory=list)

    async def publish(self, task: SliceMessage, priority: int) -> None:
        self.tasks.append((task, priority))

    async def announce(self, event: JobEvent) -> None:
        self.events.append(event)

    def indexes(self, batch_id: str | None = None) -> list[list[int]]:
        """Row indexes of each published slice, in publish order."""
        return [
            [r.index for r in task.rows]
            for task, _ in self.tasks
            if batch_id is None or task.batch_id == batch_id
        ]

    def flat(self, batch_id: str | None = None) -> list[int]:
        return [i for part in self.indexes(batch_id) for i in part]
