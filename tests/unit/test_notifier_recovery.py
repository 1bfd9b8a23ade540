"""Unit tests of taking over webhook claims whose notifier died, and of recording."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from types import SimpleNamespace

import orjson
import pytest

from relay_batches.bus.topology import Names
from relay_batches.errors import TransientError
from relay_batches.ledger.deliveries import Claim
from relay_batches.model import Job
from relay_batches.services.notifier import __main__ as notifier_main
from relay_batches.services.notifier import core
from relay_batches.services.notifier.core import PostResult, deliver_webhook
from relay_batches.services.notifier.receivers import ReceiverGate, receiver_key
from relay_batches.services.notifier.recovery import recover_deliveries
from relay_batches.settings import Settings
from tests.helpers.fakes import BATCH, EVENT, HOOK, FakeDeliveryStore, FakePost
from tests.helpers.support import wait_until


def store_with(
    batch: Job, expired: list[str] | None = None, finish_failures: int = 0
) -> FakeDeliveryStore:
    return FakeDeliveryStore(
        batches={batch.id: batch}, expired=expired or [], finish_failures=finish_failures
    )


async def test_an_expired_claim_is_posted_and_recorded() -> None:
    store, post = store_with(BATCH, expired=[BATCH.id]), FakePost()
    assert await recover_deliveries(store, post) == 1
    assert [url for url, _ in post.posts] == [HOOK]
    assert store.finished == [(BATCH.id, "delivered", 204, None)]
    assert await recover_deliveries(store, post) == 0
    assert len(post.posts) == 1


async def test_an_expired_claim_of_a_vanished_batch_is_closed_without_a_post() -> None:
    store, post = FakeDeliveryStore(expired=["gone"]), FakePost()
    assert await recover_deliveries(store, post) == 0
    assert post.posts == []
    assert store.finished == [("gone", "failed", None, "batch or webhook URL is gone")]


async def test_recording_outlives_a_short_database_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(core, "RECORD_RETRY_S", 0)
    store, post = store_with(BATCH, finish_failures=3), FakePost(PostResult(202))
    assert await deliver_webhook(EVENT, store, post) == "delivered"
    assert len(post.posts) == 1
    assert store.finished == [(BATCH.id, "delivered", 202, None)]


@pytest.mark.parametrize("timeout_s", [0.5, 5.0, 10.0, 60.0])
def test_a_claim_outlives_a_whole_delivery(timeout_s: float) -> None:
    # POST (DNS + request under one deadline) counted twice and a margin: a live
    # notifier with its database is never marked; one without it is only marked unknown.
    claim_s = core.claim_seconds(timeout_s)
    assert claim_s >= 2 * timeout_s + core.CLAIM_MARGIN_S
    assert core.CLAIM_MARGIN_S > 0


async def test_the_notifier_claims_for_claim_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[float] = []

    class RecordingStore:
        def __init__(self, pool: object, claim_s: float) -> None:
            built.append(claim_s)

    async def fake_open(*args: object, **kwargs: object) -> object:
        return SimpleNamespace(names=Names("test"))

    monkeypatch.setattr(notifier_main, "open_pool", fake_open)
    monkeypatch.setattr(notifier_main, "open_bus", fake_open)
    monkeypatch.setattr(notifier_main, "DeliveryStore", RecordingStore)
    settings = Settings.from_env({"RELAY_WEBHOOK_TIMEOUT_S": "7"})
    async with contextlib.AsyncExitStack() as resources:
        await notifier_main.build(settings, logging.getLogger("test"), resources)
    assert built == [core.claim_seconds(7.0)]


async def test_recording_gives_up_after_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core, "RECORD_RETRY_S", 0.01)
    monkeypatch.setattr(core, "RECORD_BUDGET_S", 0.1)
    store, post = store_with(BATCH, finish_failures=10**9), FakePost()
    with pytest.raises(TransientError, match=r"within 0\.1s"):
        await deliver_webhook(EVENT, store, post)
    assert len(post.posts) == 1


async def test_expired_claims_are_taken_over_concurrently_each_right_before_its_post() -> None:
    # Each claim's clock starts right before its own POST (no POST runs before its claim),
    # and a takeover whose receiver hangs holds up neither the next claim nor its POST.
    slow = replace(BATCH, webhook_url="http://slow.example/hook")
    second = replace(BATCH, id="b" * 32, workspace_id="ws-other")
    store = store_with(slow, expired=[slow.id, second.id])
    store.batches[second.id] = second
    steps: list[str] = []
    reclaim, post, hanging = store.reclaim_expired, FakePost(), asyncio.Event()

    async def logged_reclaim(limit: int = 20) -> list[Claim]:
        taken = await reclaim(limit)
        steps.extend(f"claim {c.batch_id[:1]}" for c in taken)
        return taken

    async def logged_post(url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        steps.append(f"post {orjson.loads(body)['id'][:1]}")
        if url == slow.webhook_url:
            await hanging.wait()
        return await post(url, body, headers)

    store.reclaim_expired = logged_reclaim  # type: ignore[method-assign]
    gate = ReceiverGate(slots=4, waiters=0, wait_s=1)
    recovering = asyncio.create_task(recover_deliveries(store, logged_post, gate))

    async def other_recorded() -> bool:
        return any(f[0] == second.id for f in store.finished)

    await wait_until(other_recorded, 5, "the other receiver's takeover to be recorded")
    assert not recovering.done()
    hanging.set()
    assert await recovering == 2
    assert steps.index(f"claim {slow.id[:1]}") < steps.index(f"post {slow.id[:1]}")
    assert steps.index("claim b") < steps.index("post b")
    assert gate.in_use(receiver_key(slow.workspace_id, str(slow.webhook_url))) == 0


async def test_a_takeover_beyond_its_receivers_slots_is_handed_back_deferred() -> None:
    second = replace(BATCH, id="b" * 32)
    store = store_with(BATCH, expired=[BATCH.id, second.id])
    store.batches[second.id] = second
    gate, release = ReceiverGate(slots=1, waiters=8, wait_s=30), asyncio.Event()

    async def hanging_post(url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        await release.wait()
        return PostResult(204)

    recovering = asyncio.create_task(recover_deliveries(store, hanging_post, gate))

    async def handed_back() -> bool:
        return second.id in store.waiting

    # The receiver's one slot holds the first takeover: the second is deferred at once,
    # not queued behind it (nor POSTed beyond the receiver's slots).
    await wait_until(handed_back, 5, "the second takeover to be handed back")
    assert store.posting == [BATCH.id]
    release.set()
    assert await recovering == 1


async def test_a_claim_expired_while_posting_is_marked_unknown_and_never_posted() -> None:
    store, post = store_with(BATCH), FakePost()
    store.lost = [BATCH.id]
    assert await recover_deliveries(store, post) == 0
    assert post.posts == []
    assert store.finished == []


async def test_a_claim_taken_over_before_its_post_posts_nothing() -> None:
    store, post = store_with(BATCH), FakePost()

    async def lost(claim: Claim) -> bool:
        return False

    store.start_post = lost  # type: ignore[method-assign]
    assert await deliver_webhook(EVENT, store, post) == "taken_over"
    assert post.posts == []
    assert store.finished == []


async def test_posting_is_marked_before_the_post() -> None:
    store = store_with(BATCH)
    marked_before: list[list[str]] = []
    post = FakePost()

    async def watching(url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        marked_before.append(list(store.posting))
        return await post(url, body, headers)

    assert await deliver_webhook(EVENT, store, watching) == "delivered"
    assert marked_before == [[BATCH.id]]
