"""``POST /v1/batches/{id}/pause``, ``/resume`` and ``/retry`` over HTTP on the real
ledger and bus: the statuses each allows (409 otherwise), the paused event a dispatcher
acts on, the retry body's rules and its ``Idempotency-Key``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import asyncpg
import pytest

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import EVENT_PROGRESS
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.messages import JobEvent, RowOutcome
from tests.helpers.support import ApiClient, rows, watching


@pytest.fixture
async def progress_events(bus: Bus) -> AsyncIterator[aio_pika.abc.AbstractQueue]:
    """An exclusive queue bound to ``job.progress``."""
    async with watching(bus.names, EVENT_PROGRESS) as queue:
        yield queue


async def post(api: ApiClient, batch_id: str, verb: str, **kw: Any) -> tuple[int, Any]:
    return await api.request("POST", f"/v1/batches/{batch_id}/{verb}", **kw)


async def event_of(queue: aio_pika.abc.AbstractQueue, batch_id: str) -> JobEvent:
    """The first event on ``queue`` about ``batch_id`` (others are acked and passed over)."""
    while True:
        message = await queue.get(timeout=5)
        await message.ack()
        event = JobEvent.decode(message.body)
        if event.batch_id == batch_id:
            return event


async def test_pause_resume_and_cancel_of_a_paused_batch(
    client_a: ApiClient, progress_events: aio_pika.abc.AbstractQueue
) -> None:
    batch = await client_a.submit({"model": "gpt-4o-mini", "requests": rows(3)})

    status, paused = await post(client_a, batch["id"], "pause")
    assert (status, paused["status"], paused["id"]) == (200, "paused", batch["id"])
    event = await event_of(progress_events, batch["id"])
    assert (event.status, event.total, event.completed) == ("paused", 3, 0)

    status, body = await post(client_a, batch["id"], "pause")
    assert status == 409 and body["error"]["param"] == "id", body
    assert "paused" in body["error"]["message"]
    status, resumed = await post(client_a, batch["id"], "resume")
    assert (status, resumed["status"]) == (200, "queued")
    status, body = await post(client_a, batch["id"], "resume")
    assert status == 409 and body["error"]["param"] == "id", body

    await post(client_a, batch["id"], "pause")
    status, canceled = await post(client_a, batch["id"], "cancel")
    assert (status, canceled["status"]) == (200, "canceled")
    for verb in ("pause", "resume"):
        status, body = await post(client_a, batch["id"], verb)
        assert (status, body["error"]["param"]) == (409, "id")
    status, _ = await post(client_a, "0" * 32, "pause")
    assert status == 404


async def ended_with_a_failure(pool: asyncpg.Pool, api: ApiClient) -> dict[str, Any]:
    """A completed batch of 2 rows through the API: r-0 succeeded, r-1 dead-lettered."""
    batch = await api.submit({"model": "gpt-4o-mini", "requests": rows(2)})
    status, _ = await post(api, batch["id"], "pause")  # a paused job takes outcomes
    assert status == 200
    await OutcomeStore(pool).record(
        [
            RowOutcome(batch["id"], 0, "ok", None, attempts=1),
            RowOutcome(batch["id"], 1, None, "upstream_error: 503", 4, dead_letter=True),
        ]
    )
    ended = await api.get(batch["id"])
    assert ended["status"] == "completed"
    return ended


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"rows": "everything"}, "rows"),
        ({"rows": None}, "rows"),
        ({"rows": "failed", "model": "x"}, "model"),
        ([], None),
    ],
)
async def test_a_retry_body_outside_its_schema_is_a_400_naming_the_field(
    pool: asyncpg.Pool, client_a: ApiClient, body: Any, param: str | None
) -> None:
    ended = await ended_with_a_failure(pool, client_a)
    status, answer = await post(client_a, ended["id"], "retry", json=body)
    assert (status, answer["error"]["param"]) == (400, param), answer
    assert (await client_a.get(ended["id"]))["retries"] == []


async def test_retry_answers_201_once_per_key_and_409_or_400_when_it_cannot(
    pool: asyncpg.Pool, client_a: ApiClient
) -> None:
    ended = await ended_with_a_failure(pool, client_a)
    key = {"Idempotency-Key": f"retry-{ended['id']}"}

    status, retry = await post(client_a, ended["id"], "retry", headers=key)
    again, replayed = await post(client_a, ended["id"], "retry", headers=key)

    assert (status, retry["status"], retry["total"], retry["retry_of"]) == (
        201,
        "queued",
        1,
        ended["id"],
    )
    assert (again, replayed["id"]) == (201, retry["id"])
    assert (await client_a.get(ended["id"]))["retries"] == [retry["id"]]
    status, dead = await post(client_a, ended["id"], "retry", json={"rows": "dead_letter"})
    assert (status, dead["total"]) == (201, 1)
    status, body = await post(client_a, retry["id"], "retry")  # queued: not ended
    assert (status, body["error"]["param"]) == (409, "id")
    clean = await client_a.submit({"model": "gpt-4o-mini", "requests": rows(1)})
    await post(client_a, clean["id"], "cancel")
    status, body = await post(client_a, clean["id"], "retry", json={"rows": "failed"})
    assert (status, body["error"]["param"]) == (400, "rows")
    status, body = await post(
        client_a, ended["id"], "retry", data=b"rows", headers={"Content-Type": "text/plain"}
    )
    assert status == 415
