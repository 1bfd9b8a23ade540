"""Webhook claims against the real ledger: a notifier whose claim was taken over (it
outlived its claim before its POST) can neither POST nor overwrite the record of the
notifier that holds it now; one that outlived its claim while POSTing is not taken
over, and its record lands."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import orjson
import pytest

from relay_batches.ids import new_id
from relay_batches.ledger.deliveries import MAX_CLAIMS, Claim, DeliveryStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.messages import JobEvent
from relay_batches.model import DeliveryStatus
from relay_batches.services.notifier.core import PostResult, deliver_webhook
from relay_batches.services.notifier.recovery import recover_deliveries

NAME = "fence"  # every job of this module, so its deliveries are found and removed

HOOK = "http://127.0.0.1:9/hook"  # never connected to: every Post here is a fake


@pytest.fixture(autouse=True)
async def settle_deliveries(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Remove the deliveries these tests leave claimed, posting or deferred: the session
    database is shared, and a later sweep (``recover_deliveries`` in test_recovery.py)
    would take over a claim left here once its 30 s run out and POST it."""
    yield
    await pool.execute(
        "DELETE FROM webhook_deliveries WHERE batch_id IN (SELECT id FROM batches WHERE name = $1)",
        NAME,
    )


async def new_batch(pool: asyncpg.Pool, workspace: str | None = None) -> str:
    """A one-row batch with a webhook URL (of a new workspace unless one is given)."""
    if workspace is None:
        workspace = await KeyStore(pool).ensure_workspace(f"fence-{new_id()[:6]}")
    batch = await JobStore(pool).create(
        NewJob(new_id(), workspace, NAME, "gpt-4o-mini", 0, 1, HOOK, None, None),
        iter([("c-0", '[{"role":"user","content":"hi"}]')]),
    )
    return batch.id


async def expire(pool: asyncpg.Pool, batch_id: str) -> None:
    """Make the current claim look like its notifier died long ago."""
    await pool.execute(
        "UPDATE webhook_deliveries SET claim_expires_at = now() - interval '1 second'"
        " WHERE batch_id = $1",
        batch_id,
    )


async def delivery(pool: asyncpg.Pool, batch_id: str) -> tuple[str, int | None, int]:
    row = await pool.fetchrow(
        "SELECT status, status_code, claims FROM webhook_deliveries WHERE batch_id = $1",
        batch_id,
    )
    assert row is not None
    return row["status"], row["status_code"], row["claims"]


async def test_claims_are_numbered_and_a_stale_finish_is_fenced_out(pool: asyncpg.Pool) -> None:
    batch_id = await new_batch(pool)
    store = DeliveryStore(pool, claim_s=30)
    first = await store.claim(batch_id, HOOK, f"msg_{batch_id}")
    assert first == Claim(batch_id, 1)
    assert await store.claim(batch_id, HOOK, f"msg_{batch_id}") is None
    await expire(pool, batch_id)
    assert await store.reclaim_expired() == [Claim(batch_id, 2)]

    # The first notifier was only slow: it may not POST, and its late record must not land.
    assert not await store.start_post(first)
    assert not await store.finish(first, "failed", 500, None)
    assert await delivery(pool, batch_id) == ("sending", None, 2)
    assert await store.start_post(Claim(batch_id, 2))
    assert await store.finish(Claim(batch_id, 2), "delivered", 204, None)
    assert await delivery(pool, batch_id) == ("delivered", 204, 2)
    # Neither claim can write again once the delivery is recorded.
    assert not await store.finish(first, "failed", 500, None)
    assert not await store.finish(Claim(batch_id, 2), "failed", 500, None)
    assert await delivery(pool, batch_id) == ("delivered", 204, 2)


async def test_a_given_up_claim_cannot_be_finished(pool: asyncpg.Pool) -> None:
    batch_id = await new_batch(pool)
    store = DeliveryStore(pool, claim_s=30)
    claim = await store.claim(batch_id, HOOK, f"msg_{batch_id}")
    assert claim is not None
    await pool.execute(
        "UPDATE webhook_deliveries SET claims = $2, claim_expires_at = now() - interval '1s'"
        " WHERE batch_id = $1",
        batch_id,
        MAX_CLAIMS,
    )
    assert await store.reclaim_expired() == []  # given up: failed, nobody holds it
    assert not await store.finish(Claim(batch_id, MAX_CLAIMS), "delivered", 204, None)
    status, _, _ = await delivery(pool, batch_id)
    assert status == "failed"


class SlowPost:
    """The slow notifier's POST: while it is 'in flight', its claim expires and a second
    notifier's recovery pass runs; then it answers 500."""

    def __init__(self, pool: asyncpg.Pool, store: DeliveryStore, batch_id: str) -> None:
        self._pool, self._store, self._batch_id = pool, store, batch_id
        self.bodies: list[bytes] = []
        self.takeover_posts: list[bytes] = []
        self.during: tuple[str, int | None, int] | None = None

    async def __call__(self, url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        self.bodies.append(body)
        await expire(self._pool, self._batch_id)
        assert await recover_deliveries(self._store, self._takeover) == 0
        self.during = await delivery(self._pool, self._batch_id)
        return PostResult(500)

    async def _takeover(self, url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        self.takeover_posts.append(body)
        return PostResult(204)


async def test_a_notifier_that_outlived_its_claim_while_posting_is_not_taken_over(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    batch_id = await new_batch(pool)
    store = DeliveryStore(pool, claim_s=30)
    post = SlowPost(pool, store, batch_id)
    event = JobEvent(batch_id, "completed", 1, 1, 0)
    with caplog.at_level(logging.INFO, logger="relay.notifier"):
        assert await deliver_webhook(event, store, post) == "failed"
    # Never POSTed twice: the taker-over only marked the claim unknown ...
    assert len(post.bodies) == 1
    assert post.takeover_posts == []
    assert post.during == ("unknown", None, 1)
    assert orjson.loads(post.bodies[0])["id"] == batch_id
    # ... and the notifier that POSTed recorded how it went.
    assert await delivery(pool, batch_id) == ("failed", 500, 1)
    unknown = [r for r in caplog.records if r.getMessage() == "webhook_outcome_unknown"]
    assert [r.__dict__["batch_id"] for r in unknown] == [batch_id]


async def test_deferred_deliveries_are_listed_per_receiver_and_claimed_once(
    pool: asyncpg.Pool,
) -> None:
    store = DeliveryStore(pool, claim_s=30)
    workspace = await KeyStore(pool).ensure_workspace(f"defer-{new_id()[:6]}")
    busy = [await new_batch(pool, workspace) for _ in range(6)]
    other = await new_batch(pool, workspace)
    for batch_id in busy:
        assert await store.defer(batch_id, HOOK, f"msg_{batch_id}")
    assert await store.defer(other, HOOK + "/other", f"msg_{other}")
    assert not await store.defer(other, HOOK + "/other", f"msg_{other}")
    assert await store.claim(other, HOOK, f"msg_{other}") is None
    # Nobody holds a deferred delivery: no takeover, no giving up.
    assert await store.reclaim_expired() == []
    listed = [d for d in await store.deferred(64, 4) if d.batch_id in {*busy, other}]
    assert [d.batch_id for d in listed] == [*busy[:4], other]
    assert await store.claim_deferred(other) == Claim(other, 1)
    assert await store.claim_deferred(other) is None
    assert await delivery(pool, other) == ("sending", None, 1)
    assert other not in {d.batch_id for d in await store.deferred(64, 4)}


async def test_a_claim_handed_back_keeps_its_number_so_an_old_holder_stays_fenced(
    pool: asyncpg.Pool,
) -> None:
    """A holds claim 1 and is cut off; B takes over (2), finds the receiver full and hands
    it back deferred; C's deferred pass claims it (3). When A returns, its claim 1 must
    not match: before, the hand-back reset the number to 0 and C's claim was 1 again, so
    A and C both POSTed."""
    store = DeliveryStore(pool, claim_s=30)
    batch_id = await new_batch(pool)
    first = await store.claim(batch_id, HOOK, f"msg_{batch_id}")
    assert first == Claim(batch_id, 1)
    await expire(pool, batch_id)
    (taken,) = [c for c in await store.reclaim_expired() if c.batch_id == batch_id]
    assert taken == Claim(batch_id, 2)
    assert await store.hand_back(taken)
    assert batch_id in {d.batch_id for d in await store.deferred(64, 4)}
    again = await store.claim_deferred(batch_id)
    assert again == Claim(batch_id, 3)
    assert not await store.start_post(first), "the cut-off holder may not POST"
    assert not await store.start_post(taken)
    assert await store.start_post(again)


async def test_the_probe_sees_only_deliveries_deferred_or_come_due_since_and_not_busy(
    pool: asyncpg.Pool,
) -> None:
    store = DeliveryStore(pool, claim_s=30)
    workspace = await KeyStore(pool).ensure_workspace(f"probe-{new_id()[:6]}")
    start = await store.probe(None)
    assert not start.due, "no listing yet: nothing counts"
    deferred = await new_batch(pool, workspace)
    assert await store.defer(deferred, HOOK, f"msg_{deferred}")
    assert (await store.probe(start.at)).due
    assert not (await store.probe(start.at, [workspace])).due
    assert not (await store.probe(start.at, (), [(workspace, HOOK)])).due
    assert (await store.probe(start.at, (), [(workspace, HOOK + "/other")])).due
    later = await store.probe(start.at)
    assert later.at > start.at
    assert not (await store.probe(later.at)).due, "deferred before: the backlog is not read"

    retried = await new_batch(pool, workspace)
    claim = await store.claim(retried, HOOK, f"msg_{retried}")
    assert claim is not None and await store.start_post(claim)
    assert await store.finish(claim, DeliveryStatus.RETRYING, 503, None, retry_in_s=3600)
    assert not (await store.probe(later.at)).due, "due in an hour"
    come_due = "UPDATE webhook_deliveries SET next_attempt_at = $2 WHERE batch_id = $1"
    await pool.execute(come_due, retried, later.at + timedelta(milliseconds=1))
    assert (await store.probe(later.at)).due
    assert not (await store.probe(later.at, [workspace])).due
    await pool.execute(come_due, retried, later.at - timedelta(seconds=1))
    assert not (await store.probe(later.at)).due, "due before: left to the full listing"
    assert {deferred, retried} <= {d.batch_id for d in await store.deferred(64, 4)}
