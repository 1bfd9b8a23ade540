"""Unit tests of taking over webhook claims whose notifier died, and of recording."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from notifier import handlers
from notifier.handlers import PostResult, deliver_webhook, recover_deliveries
from relay.batches import Batch
from relay.errors import TransientError
from tests.unit.test_notifier import BATCH, EVENT, HOOK, FakePost, FakeStore


@dataclass
class RecoveringStore(FakeStore):
    """FakeStore plus expired claims to hand out, and finish calls that may fail first."""

    expired: list[str] = field(default_factory=list)
    finish_failures: int = 0

    async def reclaim_expired(self, limit: int = 20) -> list[str]:
        taken, self.expired = self.expired[:limit], self.expired[limit:]
        return taken

    async def finish(
        self, batch_id: str, status: str, status_code: int | None, error: str | None
    ) -> None:
        if self.finish_failures:
            self.finish_failures -= 1
            raise TransientError("database unavailable")
        await super().finish(batch_id, status, status_code, error)


def store_with(
    batch: Batch, expired: list[str] | None = None, finish_failures: int = 0
) -> RecoveringStore:
    return RecoveringStore(
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
    store, post = RecoveringStore(expired=["gone"]), FakePost()
    assert await recover_deliveries(store, post) == 0
    assert post.posts == []
    assert store.finished == [("gone", "failed", None, "batch or webhook URL is gone")]


async def test_recording_outlives_a_short_database_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handlers, "RECORD_RETRY_S", 0)
    store, post = store_with(BATCH, finish_failures=3), FakePost(PostResult(202))
    assert await deliver_webhook(EVENT, store, post) == "delivered"
    assert len(post.posts) == 1
    assert store.finished == [(BATCH.id, "delivered", 202, None)]
