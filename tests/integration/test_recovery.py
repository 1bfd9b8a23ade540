"""Crash recovery against the real ledger: lease takeover, stalls, dead notifiers.

A "dead" dispatcher or notifier is simulated by what it leaves in the ledger (a lease
or a claim that expired); the survivor is the real code on the real database.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from relay_batches.ids import new_id
from relay_batches.ledger.deliveries import MAX_CLAIMS, DeliveryStore
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.messages import JobEvent, RowOutcome, SliceMessage
from relay_batches.services.dispatcher.core import DispatchConfig, Dispatcher
from relay_batches.services.notifier.core import PostResult, deliver_webhook
from relay_batches.services.notifier.recovery import recover_deliveries
from tests.helpers.support import WebhookReceiver

WINDOW, SLICE = 20, 4


async def new_batch(pool: asyncpg.Pool, total: int, webhook_url: str | None = None) -> str:
    """A queued batch of ``total`` rows."""
    workspace = await KeyStore(pool).ensure_workspace(f"rec-{new_id()[:6]}")
    batch = await JobStore(pool).create(
        NewJob(new_id(), workspace, "rec", "gpt-4o-mini", 0, total, webhook_url, None, None),
        ((f"c-{i}", f'[{{"role":"user","content":"row {i}"}}]') for i in range(total)),
    )
    return batch.id


class Published:
    """The rows a dispatcher released, per job."""

    def __init__(self) -> None:
        self.tasks: list[SliceMessage] = []

    async def publish(self, task: SliceMessage, priority: int) -> None:
        self.tasks.append(task)

    async def announce(self, event: JobEvent) -> None:
        raise AssertionError(f"unexpected job failure {event}")

    def rows(self, batch_id: str) -> list[int]:
        return [r.index for t in self.tasks if t.batch_id == batch_id for r in t.rows]


def dispatcher(pool: asyncpg.Pool, published: Published, owner: str) -> Dispatcher:
    """A real dispatcher (real store) whose publishes are recorded."""
    config = DispatchConfig(owner, WINDOW, SLICE, 1000, lease_s=30, stall_s=60)
    return Dispatcher(
        DispatchStore(pool), published.publish, published.announce, lambda _: True, config
    )


async def record(pool: asyncpg.Pool, batch_id: str, indexes: list[int]) -> None:
    """Outcomes for ``indexes``, as the aggregator would record them."""
    await OutcomeStore(pool).record(
        [RowOutcome(batch_id, i, f"echo {i}", None, 1) for i in indexes]
    )


async def test_an_expired_lease_is_taken_over_from_dispatched_upto(pool: asyncpg.Pool) -> None:
    batch_id = await new_batch(pool, 100)
    first = Published()
    dead = dispatcher(pool, first, "dispatcher-dead")
    await dead.claim()
    assert first.rows(batch_id) == list(range(WINDOW))
    # It processed rows 0..9, then published 20..23 and died before recording that.
    await record(pool, batch_id, [*range(10), 20, 21, 22, 23])
    await pool.execute(
        "UPDATE batches SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
        batch_id,
    )

    second = Published()
    survivor = dispatcher(pool, second, "dispatcher-survivor")
    await survivor.claim()
    owner, upto = await pool.fetchrow(
        "SELECT lease_owner, dispatched_upto FROM batches WHERE id = $1", batch_id
    )
    assert owner == "dispatcher-survivor"
    # Resumed at dispatched_upto (20); rows 20..23 already have outcomes.
    assert second.rows(batch_id) == list(range(24, 32))
    assert upto == 32


async def test_a_live_lease_is_not_taken_over(pool: asyncpg.Pool) -> None:
    batch_id = await new_batch(pool, 10)
    await dispatcher(pool, Published(), "dispatcher-alive").claim()
    other = Published()
    await dispatcher(pool, other, "dispatcher-other").claim()
    assert other.rows(batch_id) == []


async def test_a_stalled_job_gets_its_unfinished_rows_again_once_per_stall(
    pool: asyncpg.Pool,
) -> None:
    batch_id = await new_batch(pool, 40)
    published = Published()
    owner = dispatcher(pool, published, "dispatcher-stall")
    await owner.claim()
    await record(pool, batch_id, [*range(6), 8, 9, 10])
    await owner.renew()
    published.tasks.clear()
    assert await owner.recover_stalled() == 0, "progress just happened: not stalled"

    await pool.execute(
        "UPDATE batches SET last_progress_at = now() - interval '1 hour' WHERE id = $1", batch_id
    )
    assert await owner.recover_stalled() == 1
    # No worker holds anything and nothing is queued (no rows_waiting): the rows out
    # without an outcome (6, 7, 11..19) go again; then the window (9 done + 20) is topped
    # up in whole slices of 4: rows 20..27.
    assert published.rows(batch_id) == [6, 7, *range(11, 28)]
    published.tasks.clear()
    assert await owner.recover_stalled() == 0, "the stall clock restarted"
    assert published.rows(batch_id) == []


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    """A local webhook receiver."""
    created = WebhookReceiver()
    await created.start()
    yield created
    await created.stop()


async def finished_batch(pool: asyncpg.Pool, url: str) -> str:
    """A 2-row batch, run to ``completed``."""
    batch_id = await new_batch(pool, 2, url)
    await DispatchStore(pool).claim_queued("dispatcher-x", 1000, 30)
    await record(pool, batch_id, [0, 1])
    return batch_id


async def test_a_claim_left_by_a_dead_notifier_is_delivered_once(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    batch_id = await finished_batch(pool, receiver.url)
    store = DeliveryStore(pool, claim_s=30)
    # The dead notifier claimed, then died before its POST: the claim expired.
    await pool.execute(
        "INSERT INTO webhook_deliveries (batch_id, url, status, claim_expires_at)"
        " VALUES ($1, $2, 'sending', now() - interval '1 second')",
        batch_id,
        receiver.url,
    )
    event = JobEvent(batch_id, "completed", 2, 2, 0)
    post = _poster()
    assert await deliver_webhook(event, store, post) == "already_delivered"
    assert await recover_deliveries(store, post) == 1
    assert await recover_deliveries(store, post) == 0
    assert await deliver_webhook(event, store, post) == "already_delivered"
    assert [(p["id"], p["status"]) for p in post.bodies] == [(batch_id, "completed")]
    status, claims = await pool.fetchrow(
        "SELECT status, claims FROM webhook_deliveries WHERE batch_id = $1", batch_id
    )
    assert (status, claims) == ("delivered", 2)


async def test_a_live_claim_is_left_alone_and_a_hopeless_one_given_up(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    live = await finished_batch(pool, receiver.url)
    hopeless = await finished_batch(pool, receiver.url)
    store = DeliveryStore(pool, claim_s=30)
    assert await store.claim(live, receiver.url, f"msg_{live}")
    await pool.execute(
        "INSERT INTO webhook_deliveries (batch_id, url, status, claim_expires_at, claims)"
        " VALUES ($1, $2, 'sending', now() - interval '1 second', $3)",
        hopeless,
        receiver.url,
        MAX_CLAIMS,
    )
    post = _poster()
    assert await recover_deliveries(store, post) == 0
    assert post.bodies == []
    rows = dict(
        await pool.fetch(
            "SELECT batch_id, status FROM webhook_deliveries WHERE batch_id = ANY($1)",
            [live, hopeless],
        )
    )
    assert rows == {live: "sending", hopeless: "failed"}


class _Poster:
    """A Post that records bodies instead of sending them."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []

    async def __call__(self, url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        import orjson

        assert headers["webhook-signature"].startswith("v1,")
        self.bodies.append(orjson.loads(body))
        return PostResult(204)


def _poster() -> _Poster:
    return _Poster()
