"""Unit tests of opt-in webhook retries: the backoff, when a failed attempt is retried,
and a retried delivery's POSTs through the deferred pass (notifier fakes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from relay_batches.bus.topology import Names
from relay_batches.ledger.deliveries import Attempt
from relay_batches.services.notifier.core import (
    ERROR_CHARS,
    PostResult,
    RetryPolicy,
    deliver_webhook,
)
from relay_batches.services.notifier.deferred import deliver_deferred
from relay_batches.services.notifier.receivers import ReceiverGate
from relay_batches.services.notifier.service import notifier_service
from relay_batches.webhooks import verify
from tests.helpers.fakes import BATCH, EVENT, SECRET, FakeDeliveryStore, FakePost

LOW = RetryPolicy(30.0, jitter=lambda: 0.0)  # the bottom of every jitter range
HIGH = RetryPolicy(30.0, jitter=lambda: 0.999)


@pytest.mark.parametrize(
    ("attempt", "low", "high"),
    [(1, 15.0, 30.0), (2, 30.0, 60.0), (3, 60.0, 120.0), (7, 960.0, 1920.0), (8, 1800.0, 3600.0)],
)
def test_the_backoff_doubles_with_full_jitter_over_its_upper_half(
    attempt: int, low: float, high: float
) -> None:
    assert LOW.backoff_s(attempt) == low
    assert HIGH.backoff_s(attempt) == pytest.approx(high, rel=1e-3)


@pytest.mark.parametrize("attempt", [9, 12, 20, 500])
def test_the_backoff_is_capped_at_an_hour(attempt: int) -> None:
    assert LOW.backoff_s(attempt) == 1800.0
    assert HIGH.backoff_s(attempt) == pytest.approx(3600.0, rel=1e-3)


def test_a_failed_attempt_is_retried_while_attempts_and_the_window_allow() -> None:
    assert LOW.retry_in(Attempt(1, 3, 86400.0), 0.5) == 15.0
    assert LOW.retry_in(Attempt(2, 3, 86400.0), 0.5) == 30.0
    assert LOW.retry_in(Attempt(3, 3, 86400.0), 0.5) is None, "the last attempt"
    assert LOW.retry_in(Attempt(1, 1, 86400.0), 0.5) is None, "the default rule: once"
    assert LOW.retry_in(Attempt(1, 3, 86400.0, redelivery=True), 0.5) is None
    # The next attempt must be due before the delivery's 24 h are over.
    assert LOW.retry_in(Attempt(1, 3, 20.0), 4.0) == 15.0
    assert LOW.retry_in(Attempt(1, 3, 20.0), 6.0) is None
    assert LOW.retry_in(Attempt(1, 3, 0.0), 0.0) is None


def retrying_store(max_attempts: int) -> FakeDeliveryStore:
    return FakeDeliveryStore(batches={BATCH.id: BATCH}, max_attempts=max_attempts)


async def test_a_failing_receiver_is_posted_max_attempts_times_then_the_delivery_fails() -> None:
    store, post = retrying_store(3), FakePost(PostResult(500))
    assert await deliver_webhook(EVENT, store, post, policy=LOW) == "retrying"
    assert store.retries == [(BATCH.id, 1, 15.0)]
    assert list(store.retrying) == [BATCH.id]
    gate = ReceiverGate(slots=4, waiters=0, wait_s=1)
    assert await deliver_deferred(store, post, gate, policy=LOW) == 2
    assert store.finished == [
        (BATCH.id, "retrying", 500, None),
        (BATCH.id, "retrying", 500, None),
        (BATCH.id, "failed", 500, None),
    ]
    assert store.retries == [(BATCH.id, 1, 15.0), (BATCH.id, 2, 30.0)]
    assert store.retrying == {}
    assert all(d is not None and d >= 0 for d in store.durations)
    # Every attempt is the same message, signed anew.
    assert [h["webhook-id"] for h in post.headers] == [f"msg_{BATCH.id}"] * 3
    assert all(
        verify(SECRET, h, body) for h, (_, body) in zip(post.headers, post.posts, strict=True)
    )


async def test_a_retried_delivery_that_succeeds_ends_delivered() -> None:
    store = retrying_store(5)
    answers = [PostResult(None, "timed out after 10s"), PostResult(502), PostResult(204)]

    async def post(url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        return answers.pop(0)

    assert await deliver_webhook(EVENT, store, post, policy=HIGH) == "retrying"
    assert await deliver_deferred(store, post, ReceiverGate(4, 0, 1), policy=HIGH) == 2
    assert [f[1:3] for f in store.finished] == [
        ("retrying", None),
        ("retrying", 502),
        ("delivered", 204),
    ]
    assert [round(r[2]) for r in store.retries] == [30, 60]


async def test_a_refused_delivery_is_never_retried() -> None:
    store = retrying_store(5)
    post = FakePost(PostResult(None, "refused: 10.0.0.1 is private", refused=True))
    assert await deliver_webhook(EVENT, store, post, policy=LOW) == "refused"
    assert store.retries == [] and store.retrying == {}


async def test_a_redelivery_is_one_attempt() -> None:
    store = retrying_store(5)
    store.redelivery = True
    assert await deliver_webhook(EVENT, store, FakePost(PostResult(500)), policy=LOW) == "failed"
    assert store.retries == []


async def test_the_default_rule_posts_once() -> None:
    store, post = retrying_store(1), FakePost(PostResult(500))
    assert await deliver_webhook(EVENT, store, post, policy=LOW) == "failed"
    assert await deliver_deferred(store, post, ReceiverGate(4, 0, 1), policy=LOW) == 0
    assert len(post.posts) == 1


async def test_a_long_error_is_cut_for_the_log() -> None:
    store = retrying_store(1)
    post = FakePost(PostResult(None, "x" * 10_000))
    assert await deliver_webhook(EVENT, store, post) == "failed"
    [(_, _, _, error)] = store.finished
    assert error == "x" * ERROR_CHARS


@pytest.mark.parametrize(("reconcile_s", "deferred_s"), [(2.0, 0.5), (0.2, 0.2)])
def test_due_retries_are_looked_for_at_least_twice_a_second(
    reconcile_s: float, deferred_s: float
) -> None:
    bus = SimpleNamespace(names=Names("t"))
    service = notifier_service(
        bus,  # type: ignore[arg-type]
        FakeDeliveryStore(),
        FakePost(),
        None,  # type: ignore[arg-type]
        recover_every_s=reconcile_s,
        grace_s=1.0,
        receiver_wait_s=1.0,
    )
    periods = {p.name: p.every_s for p in service._periodic}
    assert periods == {"recover-deliveries": reconcile_s, "deliver-deferred": deferred_s}
