"""Unit tests of when the deferred pass lists the waiting deliveries: a cheap probe at
every poll, the full listing only when the probe finds something new, when a POST of the
pass ended, or every ``full_every_s``; a hanging receiver's backlog is not re-read at
every refill."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from relay_batches.ledger.deliveries import Deferred, Probe
from relay_batches.services.notifier import deferred
from relay_batches.services.notifier.core import PostResult
from relay_batches.services.notifier.deferred import DueWatch, deliver_deferred
from relay_batches.services.notifier.receivers import ReceiverGate
from tests.helpers.fakes import BATCH, HOOK, FakeDeliveryStore, FakePost
from tests.helpers.support import wait_until

AT = datetime(2026, 1, 1, tzinfo=UTC)


class ProbedStore(FakeDeliveryStore):
    """A fake ledger whose probe answers ``due`` as set, recording what it was asked,
    and which counts its full listings."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.due = False
        self.asked: list[tuple[datetime | None, list[str], list[tuple[str, str]]]] = []
        self.listings = 0

    async def probe(
        self,
        since: datetime | None,
        skip_workspaces: Sequence[str] = (),
        skip_receivers: Sequence[tuple[str, str]] = (),
    ) -> Probe:
        self.asked.append((since, list(skip_workspaces), list(skip_receivers)))
        return Probe(AT + timedelta(seconds=len(self.asked)), self.due)

    async def deferred(
        self,
        limit: int,
        per_receiver: int,
        skip_workspaces: Sequence[str] = (),
        skip_receivers: Sequence[tuple[str, str]] = (),
    ) -> list[Deferred]:
        self.listings += 1
        return await super().deferred(limit, per_receiver, skip_workspaces, skip_receivers)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_watch_lists_first_then_on_a_probe_hit_or_the_timer_only() -> None:
    store, clock = ProbedStore(), Clock()
    gate = ReceiverGate(slots=4, waiters=0, wait_s=1)
    watch = DueWatch(2.0, clock)
    assert await watch.listing_due(store, gate), "the first pass lists"
    assert store.asked[-1][0] is None
    clock.now += 0.5
    assert not await watch.listing_due(store, gate), "nothing new, timer not up"
    # Since the probe before the listing, less the overlap (a late commit is still seen).
    assert store.asked[-1][0] == AT + timedelta(seconds=1) - timedelta(
        seconds=deferred.PROBE_OVERLAP_S
    )
    store.due = True
    clock.now += 0.5
    assert await watch.listing_due(store, gate), "something came due"
    store.due = False
    clock.now += 0.5
    assert not await watch.listing_due(store, gate)
    assert store.asked[-1][0] == AT + timedelta(seconds=3 - deferred.PROBE_OVERLAP_S)
    clock.now += 1.5
    assert await watch.listing_due(store, gate), "2 s after the last listing"


async def test_the_probe_leaves_out_the_receivers_and_workspaces_busy_here() -> None:
    store = ProbedStore()
    gate = ReceiverGate(slots=1, waiters=0, wait_s=1, per_workspace=1)
    hold = gate.reserve(BATCH.workspace_id, HOOK)
    assert hold is not None
    await DueWatch(2.0).listing_due(store, gate)
    assert store.asked == [(None, [BATCH.workspace_id], [(BATCH.workspace_id, HOOK)])]


async def test_a_pass_that_finds_nothing_new_is_only_a_probe() -> None:
    store = ProbedStore(batches={BATCH.id: BATCH}, waiting={BATCH.id: HOOK})
    gate, post, watch = ReceiverGate(slots=4, waiters=0, wait_s=1), FakePost(), DueWatch(60.0)
    await watch.listing_due(store, gate)  # the first listing was made (by an earlier pass)
    assert await deliver_deferred(store, post, gate, watch=watch) == 0
    assert (store.listings, len(store.asked), post.posts) == (0, 2, [])
    store.due = True
    assert await deliver_deferred(store, post, gate, watch=watch) == 1
    assert [url for url, _ in post.posts] == [HOOK]


async def test_a_hanging_post_does_not_make_every_refill_list_the_backlog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One receiver hangs (one slot); its backlog waits. While the POST hangs the pass
    # only probes; when it ends a slot is free, so the pass lists and starts the next.
    monkeypatch.setattr(deferred, "REFILL_S", 0.01)
    second = replace(BATCH, id="b" * 32)
    store = ProbedStore(
        batches={BATCH.id: BATCH, second.id: second},
        waiting={BATCH.id: HOOK, second.id: HOOK},
    )
    gate, hanging = ReceiverGate(slots=1, waiters=0, wait_s=1), asyncio.Event()
    posted = FakePost()

    async def post(url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        await hanging.wait()
        return await posted(url, body, headers)

    watch = DueWatch(60.0)
    passing = asyncio.create_task(deliver_deferred(store, post, gate, watch=watch))

    async def probed_a_while() -> bool:
        return len(store.asked) >= 10

    await wait_until(probed_a_while, 5, "ten refills", 0.01)
    assert store.listings == 1, "one listing; the refills only probed"
    assert store.waiting == {second.id: HOOK}
    hanging.set()
    assert await asyncio.wait_for(passing, 5) == 2
    assert [url for url, _ in posted.posts] == [HOOK, HOOK]
    assert store.listings == 3  # after each POST ended: the second one, then nothing left
