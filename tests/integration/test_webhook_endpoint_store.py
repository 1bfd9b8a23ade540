"""Webhook endpoints against the real ledger: created, listed and deleted one workspace at
a time (at most 20); a batch's end recorded once per matching endpoint with its event
fixed (the batch id as its surface shows it); each endpoint's delivery claimed, logged,
retried, redelivered and fenced on its own beside the batch's own webhook; a deleted
endpoint's pending event fails unsent; and the notifier POSTs it signed with the
endpoint's secret, retrying as the workspace opted in."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

import asyncpg
import openai
import orjson
import pytest
from openai.types.webhooks import BatchCancelledWebhookEvent

from relay_batches.errors import ConflictError
from relay_batches.ids import new_id
from relay_batches.ledger.deliveries import DeliveryStore
from relay_batches.ledger.delivery_log import DeliveryLog
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.webhook_endpoints import MAX_ENDPOINTS, WebhookEndpoints
from relay_batches.messages import JobEvent
from relay_batches.model import DeliveryStatus, Job
from relay_batches.services.notifier.core import PostResult, RetryPolicy, deliver_webhook
from relay_batches.services.notifier.deferred import deliver_deferred
from relay_batches.services.notifier.receivers import ReceiverGate

NAME = "endpoint-store"  # every job of this module, so its deliveries are found and removed
ALL = ("batch.completed", "batch.failed", "batch.cancelled", "batch.expired")


@pytest.fixture(autouse=True)
async def settle_deliveries(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Remove this module's deliveries: one left due would be POSTed by another test."""
    yield
    await pool.execute(
        "DELETE FROM webhook_deliveries WHERE batch_id IN (SELECT id FROM batches WHERE name = $1)",
        NAME,
    )


async def new_workspace(pool: asyncpg.Pool, max_attempts: int = 1) -> str:
    """A fresh workspace (its id) whose webhooks get ``max_attempts`` attempts."""
    keys = KeyStore(pool)
    name = f"ep-{new_id()[:8]}"
    workspace_id = await keys.ensure_workspace(name)
    assert await keys.set_webhook_max_attempts(name, max_attempts) == max_attempts
    return workspace_id


async def canceled_job(
    pool: asyncpg.Pool, workspace_id: str, surface: str | None = None, url: str | None = None
) -> Job:
    """A one-row batch of the workspace, canceled (ended) at once."""
    jobs = JobStore(pool)
    new = NewJob(new_id(), workspace_id, NAME, "gpt-4o-mini", 0, 1, url, None, None)
    new = replace(new, surface=surface)
    created = await jobs.create(new, iter([("c-0", '[{"role":"user","content":"hi"}]')]))
    return await jobs.cancel(workspace_id, created.id)


async def test_endpoints_belong_to_one_workspace_and_are_bounded(pool: asyncpg.Pool) -> None:
    store = WebhookEndpoints(pool)
    mine, other = await new_workspace(pool), await new_workspace(pool)
    first = await store.create(mine, "https://a.example/h", ALL)
    second = await store.create(mine, "https://b.example/h", ("batch.failed",))
    assert first.secret is not None and first.secret != second.secret
    assert [e.id for e in await store.list(mine)] == [first.id, second.id]
    assert all(e.secret is None for e in await store.list(mine))
    assert await store.list(other) == []
    assert not await store.delete(other, first.id)
    assert await store.delete(mine, first.id)
    assert not await store.delete(mine, first.id)
    for n in range(MAX_ENDPOINTS - 1):
        await store.create(mine, f"https://c{n}.example/h", ALL)
    with pytest.raises(ConflictError):
        await store.create(mine, "https://one-too-many.example/h", ALL)
    assert len(await store.list(mine)) == MAX_ENDPOINTS


async def test_an_end_is_recorded_once_per_matching_endpoint_with_the_surface_id(
    pool: asyncpg.Pool,
) -> None:
    endpoints, deliveries = WebhookEndpoints(pool), DeliveryStore(pool)
    workspace = await new_workspace(pool)
    every = await endpoints.create(workspace, "https://every.example/h", ALL)
    failures = await endpoints.create(workspace, "https://failures.example/h", ("batch.failed",))
    native = await canceled_job(pool, workspace)
    anthropic = await canceled_job(pool, workspace, surface="anthropic")
    openai_job = await canceled_job(pool, workspace)
    await pool.execute(
        "INSERT INTO openai_batches (batch_id, workspace_id, input_file_id, output_file_id,"
        " error_file_id, endpoint, completion_window) VALUES ($1, $2, $3, $4, $5, $6, '24h')",
        openai_job.id,
        workspace,
        new_id(),
        new_id(),
        new_id(),
        "/v1/chat/completions",
    )

    shown = {}
    for job in (native, anthropic, openai_job):
        assert await deliveries.fan_out(job) == 1  # the batch.failed-only endpoint: none
        assert await deliveries.fan_out(job) == 0  # a redelivered job.finished adds none
        target = await deliveries.endpoint_target(job.id, every.id)
        assert target is not None and target.secret == every.secret
        assert target.url == "https://every.example/h"
        event = orjson.loads(target.body)
        assert event["id"] == target.message_id and event["id"].startswith("evt_")
        assert (event["object"], event["type"]) == ("event", "batch.cancelled")
        assert job.completed_at is not None
        assert event["created_at"] == int(job.completed_at.timestamp())
        shown[job.id] = event["data"]["id"]
        assert await deliveries.endpoint_target(job.id, failures.id) is None
    assert shown == {
        native.id: native.id,
        anthropic.id: "msgbatch_" + anthropic.id,
        openai_job.id: "batch_" + openai_job.id,
    }


async def test_each_endpoint_delivery_is_claimed_logged_and_redelivered_on_its_own(
    pool: asyncpg.Pool,
) -> None:
    endpoints, deliveries, log = WebhookEndpoints(pool), DeliveryStore(pool), DeliveryLog(pool)
    workspace = await new_workspace(pool)
    one = await endpoints.create(workspace, "https://one.example/h", ALL)
    two = await endpoints.create(workspace, "https://two.example/h", ALL)
    job = await canceled_job(pool, workspace, url="https://own.example/h")
    assert await deliveries.fan_out(job) == 2
    own = await deliveries.claim(job.id, "https://own.example/h", f"msg_{job.id}")
    assert own is not None and own.endpoint_id == ""

    waiting = [d for d in await deliveries.deferred(100, 100) if d.batch_id == job.id]
    assert sorted((d.endpoint_id, d.url) for d in waiting) == sorted(
        [(one.id, "https://one.example/h"), (two.id, "https://two.example/h")]
    )
    claim = await deliveries.claim_deferred(job.id, one.id)
    assert claim is not None and claim.endpoint_id == one.id
    assert await deliveries.claim_deferred(job.id, one.id) is None  # claimed once
    attempt = await deliveries.start_post(claim)
    assert attempt is not None and attempt.number == 1
    assert await deliveries.finish(claim, DeliveryStatus.DELIVERED, 204, None, duration_ms=3)

    page = await log.attempts(job.id, 0, 10, one.id)
    assert page.status == DeliveryStatus.DELIVERED
    assert [(a.attempt, a.status, a.response_status) for a in page.attempts] == [
        (1, "delivered", 204)
    ]
    assert (await log.attempts(job.id, 0, 10, two.id)).status == DeliveryStatus.SENDING
    assert (await log.attempts(job.id, 0, 10)).status == DeliveryStatus.SENDING  # its own
    assert (await log.attempts(job.id, 0, 10)).attempts == []

    await pool.execute(
        "UPDATE webhook_deliveries SET finished_at = now() - interval '1 minute'"
        " WHERE batch_id = $1 AND endpoint_id = $2",
        job.id,
        one.id,
    )
    scheduled = await log.request_redelivery(job, one.id)
    assert scheduled.status == DeliveryStatus.RETRYING
    again = await deliveries.claim_deferred(job.id, one.id)
    assert again is not None and (await deliveries.start_post(again)) is not None
    outsider = await endpoints.create(workspace, "https://late.example/h", ALL)
    with pytest.raises(ConflictError):
        await log.request_redelivery(job, outsider.id)  # created after the batch ended


async def test_a_deleted_endpoint_gets_nothing_and_the_notifier_signs_with_its_secret(
    pool: asyncpg.Pool,
) -> None:
    endpoints, store = WebhookEndpoints(pool), DeliveryStore(pool, claim_s=30.0)
    workspace = await new_workspace(pool, max_attempts=2)
    kept = await endpoints.create(workspace, "https://kept.example/h", ALL)
    gone = await endpoints.create(workspace, "https://gone.example/h", ALL)
    job = await canceled_job(pool, workspace)
    post = FailingThenOk()

    finished = JobEvent(job.id, job.status, job.total, job.completed, job.failed)
    assert await deliver_webhook(finished, store, post) == "no_webhook"  # events recorded
    assert await endpoints.delete(workspace, gone.id)
    gate = ReceiverGate(4, 8, 5.0, 16)
    policy = RetryPolicy(base_s=0.0, jitter=lambda: 0.0)
    await deliver_deferred(store, post, gate, policy=policy)  # kept: 500, retrying
    await deliver_deferred(store, post, gate, policy=policy)  # kept: 204
    mine = [(url, body, h) for url, body, h in post.calls if url.endswith(".example/h")]
    assert [url for url, _, _ in mine] == ["https://kept.example/h"] * 2

    log = DeliveryLog(pool)
    kept_log = await log.attempts(job.id, 0, 10, kept.id)
    assert kept_log.status == DeliveryStatus.DELIVERED
    assert [(a.status, a.response_status) for a in kept_log.attempts] == [
        ("failed", 500),
        ("delivered", 204),
    ]
    gone_row = await pool.fetchrow(
        "SELECT status, error, attempts FROM webhook_deliveries"
        " WHERE batch_id = $1 AND endpoint_id = $2",
        job.id,
        gone.id,
    )
    assert gone_row is not None
    assert (gone_row["status"], gone_row["attempts"]) == ("failed", 0)
    assert "deleted" in gone_row["error"]

    _, body, headers = mine[-1]
    sdk = openai.OpenAI(api_key="unused", webhook_secret=kept.secret).webhooks
    event = sdk.unwrap(body, headers)
    assert isinstance(event, BatchCancelledWebhookEvent) and event.data.id == job.id
    assert mine[0][1] == body and mine[0][2]["webhook-id"] == headers["webhook-id"] == event.id


@dataclass
class FailingThenOk:
    """Answers 500 to its first POST of each URL, then 204; keeps every call."""

    calls: list[tuple[str, bytes, dict[str, str]]] = field(default_factory=list)

    async def __call__(self, url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        seen = any(u == url for u, _, _ in self.calls)
        self.calls.append((url, body, headers))
        return PostResult(204 if seen else 500)
