"""Unit tests of the notifier: the completion webhook body, once-only delivery, records."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from relay_batches.messages import JobEvent
from relay_batches.model import Job
from relay_batches.services.notifier.core import PostResult, deliver_webhook
from relay_batches.webhooks import verify
from tests.helpers.fakes import BATCH, EVENT, HOOK, SECRET, FakeDeliveryStore, FakePost

# A job with no answered row recorded in any lane.
NO_LANES = {lane: {"rows": 0, "cost_usd": 0.0} for lane in ("batch", "flex", "realtime")}


def store_with(batch: Job) -> FakeDeliveryStore:
    return FakeDeliveryStore(batches={batch.id: batch})


async def test_delivers_the_api_webhook_body() -> None:
    store, post = store_with(BATCH), FakePost()
    assert await deliver_webhook(EVENT, store, post) == "delivered"
    ((url, body),) = post.posts
    assert url == HOOK
    assert body == orjson.dumps(
        {
            "id": "9f2c1b7e4a8d4e51b0c6d3f2a1e5c7b9",
            "name": "Review sentiment — October",
            "status": "completed",
            "total": 3,
            "completed": 2,
            "failed": 1,
            "dead_letter": 1,
            "completed_at": "2026-10-04T09:20:01Z",
            "cost_usd": 0.0,
            "cached_tokens": 0,
            "saving": {"all_realtime_usd": 0.0, "saved_usd": 0.0, "saved_fraction": None},
            "lanes": NO_LANES,
        }
    )
    assert store.claims == {BATCH.id: HOOK}
    assert store.finished == [(BATCH.id, "delivered", 204, None)]


async def test_canceled_run_reports_canceled() -> None:
    batch = replace(BATCH, status="canceled", completed=1, failed=0, dead_letter=0)
    store, post = store_with(batch), FakePost(PostResult(200))
    assert await deliver_webhook(JobEvent(batch.id, "canceled", 3, 1, 0), store, post) == (
        "delivered"
    )
    assert orjson.loads(post.posts[0][1]) == {
        "id": batch.id,
        "name": batch.name,
        "status": "canceled",
        "total": 3,
        "completed": 1,
        "failed": 0,
        "dead_letter": 0,
        "completed_at": "2026-10-04T09:20:01Z",
        "cost_usd": 0.0,
        "cached_tokens": 0,
        "saving": {"all_realtime_usd": 0.0, "saved_usd": 0.0, "saved_fraction": None},
        "lanes": NO_LANES,
    }


async def test_second_delivery_is_claimed_already_and_posts_nothing() -> None:
    store, post = store_with(BATCH), FakePost()
    assert await deliver_webhook(EVENT, store, post) == "delivered"
    assert await deliver_webhook(EVENT, store, post) == "already_delivered"
    assert len(post.posts) == 1
    assert store.finished == [(BATCH.id, "delivered", 204, None)]


async def test_no_webhook_url() -> None:
    store, post = store_with(replace(BATCH, webhook_url=None)), FakePost()
    assert await deliver_webhook(EVENT, store, post) == "no_webhook"
    assert post.posts == []
    assert store.claims == {}
    assert store.finished == []


async def test_unknown_batch_has_no_webhook() -> None:
    store, post = FakeDeliveryStore(), FakePost()
    assert await deliver_webhook(EVENT, store, post) == "no_webhook"
    assert post.posts == []
    assert store.claims == {}


async def test_cron_template_never_posts() -> None:
    store, post = store_with(replace(BATCH, cron="0 * * * *", status="scheduled")), FakePost()
    assert await deliver_webhook(EVENT, store, post) == "no_webhook"
    assert post.posts == []


async def test_failed_post_is_recorded_with_its_error() -> None:
    store = store_with(BATCH)
    post = FakePost(PostResult(None, "timed out after 10s"))
    assert await deliver_webhook(EVENT, store, post) == "failed"
    assert len(post.posts) == 1
    assert store.finished == [(BATCH.id, "failed", None, "timed out after 10s")]
    # Failed or not, the delivery was claimed: no second attempt.
    assert await deliver_webhook(EVENT, store, post) == "already_delivered"
    assert len(post.posts) == 1


@pytest.mark.parametrize("code", [199, 301, 404, 500])
async def test_non_2xx_is_a_failed_delivery(code: int) -> None:
    store, post = store_with(BATCH), FakePost(PostResult(code))
    assert await deliver_webhook(EVENT, store, post) == "failed"
    assert store.finished == [(BATCH.id, "failed", code, None)]


@pytest.mark.parametrize(("code", "delivered"), [(200, True), (299, True), (300, False)])
def test_post_result_delivered(code: int, delivered: bool) -> None:
    assert PostResult(code).delivered is delivered
    assert PostResult(None, "boom").delivered is False


async def test_the_webhook_is_signed_with_the_workspace_secret() -> None:
    store, post = store_with(BATCH), FakePost()
    await deliver_webhook(EVENT, store, post)
    [headers] = post.headers
    [(_, body)] = post.posts
    assert headers["webhook-id"] == f"msg_{BATCH.id}"
    assert verify(SECRET, headers, body)
    assert not verify(SECRET, headers, body + b" ")


async def test_a_refused_delivery_is_recorded_as_refused() -> None:
    store = store_with(BATCH)
    post = FakePost(PostResult(None, "refused: 127.0.0.1 is loopback", refused=True))
    assert await deliver_webhook(EVENT, store, post) == "refused"
    assert store.finished == [(BATCH.id, "refused", None, "refused: 127.0.0.1 is loopback")]
