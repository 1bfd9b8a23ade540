"""Unit tests of receiver isolation: per-receiver slots, a bounded wait, bounded waiters,
and a delivery's record made after its slot is released."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from relay_batches.services.notifier import core
from relay_batches.services.notifier.core import PostResult, deliver_webhook
from relay_batches.services.notifier.deferred import deliver_deferred
from relay_batches.services.notifier.receivers import ReceiverBusy, ReceiverGate, receiver_key
from tests.helpers.fakes import BATCH, EVENT, FakeDeliveryStore, FakePost


def test_a_receiver_is_a_workspace_and_an_authority() -> None:
    assert receiver_key("ws1", "https://Hooks.Example/a?x=1") == ("ws1", "hooks.example:443")
    assert receiver_key("ws1", "http://hooks.example:8080/b") == ("ws1", "hooks.example:8080")
    assert receiver_key("ws2", "http://hooks.example:8080/b") != receiver_key(
        "ws1", "http://hooks.example:8080/b"
    )


async def test_a_full_receiver_does_not_hold_up_another() -> None:
    gate = ReceiverGate(slots=2, waiters=1, wait_s=5)
    slow, other = ("ws1", "http://slow/"), ("ws2", "http://fast/")
    release = asyncio.Event()
    entered = asyncio.Semaphore(0)

    async def hold(key: tuple[str, str]) -> None:
        async with gate.slot(*key):
            entered.release()
            await release.wait()

    holders = [asyncio.create_task(hold(slow)) for _ in range(2)]
    for _ in holders:
        await entered.acquire()
    waiter = asyncio.create_task(hold(slow))
    await asyncio.sleep(0)
    assert gate.in_use(receiver_key(*slow)) == 3
    with pytest.raises(ReceiverBusy, match="3 deliveries open"):
        async with gate.slot(*slow):
            pass
    async with asyncio.timeout(1):
        async with gate.slot(*other):
            assert gate.in_use(receiver_key(*other)) == 1
    release.set()
    await asyncio.gather(*holders, waiter)
    assert gate.in_use(receiver_key(*slow)) == gate.in_use(receiver_key(*other)) == 0


async def test_a_wait_for_a_slot_is_bounded() -> None:
    gate = ReceiverGate(slots=1, waiters=4, wait_s=0.05)
    url = "http://slow/"
    async with gate.slot("ws1", url):
        with pytest.raises(ReceiverBusy, match=r"no free slot within 0\.05s"):
            async with gate.slot("ws1", url):
                pass
    assert gate.in_use(receiver_key("ws1", url)) == 0


async def test_the_record_is_made_after_the_receiver_slot_is_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(core, "RECORD_RETRY_S", 0)
    gate = ReceiverGate(slots=1, waiters=0, wait_s=1)
    key = receiver_key(BATCH.workspace_id, str(BATCH.webhook_url))
    store = FakeDeliveryStore(batches={BATCH.id: BATCH}, finish_failures=2)
    in_use_at_finish: list[int] = []
    finish = store.finish

    async def watching(*args: object, **kwargs: object) -> bool:
        in_use_at_finish.append(gate.in_use(key))
        return await finish(*args, **kwargs)  # type: ignore[arg-type]

    store.finish = watching  # type: ignore[method-assign,assignment]

    async def post(url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        assert gate.in_use(key) == 1
        return PostResult(204)

    assert await deliver_webhook(EVENT, store, post, gate) == "delivered"
    assert in_use_at_finish == [0, 0, 0]


async def test_a_delivery_without_a_receiver_slot_is_deferred_not_held() -> None:
    gate = ReceiverGate(slots=1, waiters=0, wait_s=1)
    key = receiver_key(BATCH.workspace_id, str(BATCH.webhook_url))
    store, post = FakeDeliveryStore(batches={BATCH.id: BATCH}), FakePost()
    async with gate.slot(BATCH.workspace_id, str(BATCH.webhook_url)):
        assert gate.in_use(key) == 1
        assert await deliver_webhook(EVENT, store, post, gate) == "deferred"
        assert await deliver_webhook(EVENT, store, post, gate) == "already_delivered"
        # While the receiver is busy, the deferred pass leaves it waiting.
        assert await deliver_deferred(store, post, gate) == 0
    assert post.posts == []
    assert list(store.waiting) == [BATCH.id]
    assert await deliver_deferred(store, post, gate) == 1
    assert [url for url, _ in post.posts] == [BATCH.webhook_url]
    assert store.finished == [(BATCH.id, "delivered", 204, None)]
    assert await deliver_deferred(store, post, gate) == 0
    assert len(post.posts) == 1


async def test_a_workspace_holds_at_most_its_cap_over_all_its_receivers() -> None:
    gate = ReceiverGate(slots=4, waiters=8, wait_s=30, per_workspace=3)
    holds = [gate.reserve("ws1", f"http://hooks.example:{8000 + n}/") for n in range(3)]
    assert all(holds)
    assert gate.open_in("ws1") == 3
    assert gate.full_workspaces() == ["ws1"]
    # A fourth receiver of the same workspace is refused at once, even willing to wait.
    async with asyncio.timeout(1):
        with pytest.raises(ReceiverBusy, match="workspace ws1 has 3 deliveries open"):
            async with gate.slot("ws1", "http://hooks.example:9000/"):
                pass
        async with gate.slot("ws2", "http://hooks.example:9000/"):
            assert gate.open_in("ws2") == 1
    for hold in holds:
        assert hold is not None
        gate.release(hold)
    assert gate.open_in("ws1") == 0 and gate.full_workspaces() == []


async def test_a_released_slot_passes_to_the_longest_waiter() -> None:
    gate = ReceiverGate(slots=1, waiters=2, wait_s=5)
    url, order = "http://slow/", []
    first = gate.reserve("ws1", url)
    assert first is not None
    assert gate.busy_receivers() == [("ws1", url)]

    async def wait_turn(name: str) -> None:
        async with gate.slot("ws1", url):
            order.append(name)

    waiting = [asyncio.create_task(wait_turn(n)) for n in ("a", "b")]
    await asyncio.sleep(0)
    assert gate.reserve("ws1", url) is None  # no jumping the queue
    gate.release(first)
    await asyncio.gather(*waiting)
    assert order == ["a", "b"]
    assert gate.in_use(receiver_key("ws1", url)) == 0 and gate.busy_receivers() == []


async def test_a_stopping_deferred_pass_starts_nothing_and_ends_with_its_posts() -> None:
    store = FakeDeliveryStore(batches={BATCH.id: BATCH})
    other = replace(BATCH, id="b" * 32, workspace_id="ws-other")
    store.batches[other.id] = other
    store.waiting = {BATCH.id: str(BATCH.webhook_url)}
    gate, stopping, posted = ReceiverGate(slots=4, waiters=0, wait_s=1), [False], []

    async def post(url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        posted.append(url)
        stopping[0] = True  # the service is told to stop while this POST is out,
        store.waiting[other.id] = str(other.webhook_url)  # and another is deferred
        return PostResult(204)

    assert await asyncio.wait_for(deliver_deferred(store, post, gate, lambda: stopping[0]), 5) == 1
    assert posted == [BATCH.webhook_url]
    assert list(store.waiting) == [other.id]
