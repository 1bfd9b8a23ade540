"""The webhook delivery log, automatic retries and redeliveries against the real ledger:
each attempt is logged by the statements that mark and end it, fenced like the delivery;
a retrying delivery is claimed once when due; a redelivery re-arms an ended delivery, is
refused while an attempt is under way, within 10 s of the last end and past 100 attempts,
only makes a pending retry due (keeping its retries), and before any delivery is the
ordinary first one; the retry window starts at the first attempt; and the API shows and
asks for them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from relay_batches.errors import ConflictError
from relay_batches.ids import new_id
from relay_batches.ledger.deliveries import Attempt, Claim, DeliveryStore
from relay_batches.ledger.delivery_log import DeliveryLog, Scheduled
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.model import DeliveryStatus, Job
from tests.helpers.support import ApiClient, Isolation, expire_delivery_claim, relay_admin

NAME = "delivery-log"  # every job of this module, so its deliveries are found and removed
HOOK = "http://127.0.0.1:9/hook"  # never connected to: nothing here POSTs
DAY_S = 24 * 3600


@pytest.fixture(autouse=True)
async def settle_deliveries(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Remove this module's deliveries: a claimed or due one left in the shared session
    database would be POSTed by another test's notifier passes."""
    yield
    await pool.execute(
        "DELETE FROM webhook_deliveries WHERE batch_id IN (SELECT id FROM batches WHERE name = $1)",
        NAME,
    )


async def new_workspace(pool: asyncpg.Pool, max_attempts: int = 1) -> str:
    """A workspace whose webhooks get ``max_attempts`` attempts; return its name."""
    keys = KeyStore(pool)
    name = f"dlog-{new_id()[:8]}"
    await keys.ensure_workspace(name)
    assert await keys.set_webhook_max_attempts(name, max_attempts) == max_attempts
    return name


async def new_job(pool: asyncpg.Pool, workspace_name: str, url: str | None = HOOK) -> Job:
    """A one-row batch of ``workspace_name``, canceled (terminal) at once."""
    workspace = await KeyStore(pool).ensure_workspace(workspace_name)
    jobs = JobStore(pool)
    created = await jobs.create(
        NewJob(new_id(), workspace, NAME, "gpt-4o-mini", 0, 1, url, None, None),
        iter([("c-0", '[{"role":"user","content":"hi"}]')]),
    )
    return await jobs.cancel(workspace, created.id)


async def attempt_rows(pool: asyncpg.Pool, batch_id: str) -> list[tuple[object, ...]]:
    rows = await pool.fetch(
        "SELECT attempt, status, response_status, error, duration_ms, redelivery"
        " FROM webhook_attempts WHERE batch_id = $1 ORDER BY attempt",
        batch_id,
    )
    return [tuple(r) for r in rows]


async def delivery(pool: asyncpg.Pool, batch_id: str) -> tuple[str, int, int]:
    row = await pool.fetchrow(
        "SELECT status, attempts, claims FROM webhook_deliveries WHERE batch_id = $1", batch_id
    )
    assert row is not None
    return row["status"], row["attempts"], row["claims"]


async def make_due(pool: asyncpg.Pool, batch_id: str) -> None:
    await pool.execute(
        "UPDATE webhook_deliveries SET next_attempt_at = now() - interval '1s' WHERE batch_id = $1",
        batch_id,
    )


async def ended_long_ago(pool: asyncpg.Pool, batch_id: str) -> None:
    """Date the delivery's last end back past the redelivery cooldown (10 s)."""
    await pool.execute(
        "UPDATE webhook_deliveries SET finished_at = now() - interval '11s' WHERE batch_id = $1",
        batch_id,
    )


async def stored(pool: asyncpg.Pool, batch_id: str) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT status, deferred, redelivery, retry_until, next_attempt_at, attempts,"
        " now() AS now FROM webhook_deliveries WHERE batch_id = $1",
        batch_id,
    )
    assert row is not None
    return row


def due_ids(listed: list[object]) -> set[str]:
    return {d.batch_id for d in listed}  # type: ignore[attr-defined]


async def test_each_attempt_is_logged_when_it_starts_and_ended_with_the_delivery(
    pool: asyncpg.Pool,
) -> None:
    job = await new_job(pool, await new_workspace(pool))
    store = DeliveryStore(pool, claim_s=30)
    claim = await store.claim(job.id, HOOK, f"msg_{job.id}")
    assert claim == Claim(job.id, 1)
    attempt = await store.start_post(claim)
    assert attempt is not None
    assert (attempt.number, attempt.max_attempts, attempt.redelivery) == (1, 1, False)
    assert DAY_S - 60 < attempt.retry_window_s <= DAY_S
    assert await attempt_rows(pool, job.id) == [(1, "posting", None, None, None, False)]
    assert await store.finish(claim, DeliveryStatus.FAILED, 500, None, duration_ms=12)
    assert await attempt_rows(pool, job.id) == [(1, "failed", 500, None, 12, False)]
    assert await delivery(pool, job.id) == ("failed", 1, 1)

    page = await DeliveryLog(pool).attempts(job.id, 0, 100)
    assert (page.status, page.next_attempt_at, page.has_more) == ("failed", None, False)
    [logged] = [a.to_api() for a in page.attempts]
    assert logged.pop("attempted_at").endswith("Z")
    assert logged == {
        "id": f"{job.id}.1",
        "object": "webhook_delivery",
        "attempt": 1,
        "status": "failed",
        "response_status": 500,
        "error": None,
        "duration_ms": 12,
        "redelivery": False,
    }


async def test_an_attempt_whose_holder_went_silent_is_logged_unknown_and_its_late_record_lands(
    pool: asyncpg.Pool,
) -> None:
    job = await new_job(pool, await new_workspace(pool))
    store = DeliveryStore(pool, claim_s=30)
    claim = await store.claim(job.id, HOOK, f"msg_{job.id}")
    assert claim is not None and await store.start_post(claim)
    await expire_delivery_claim(pool, job.id)
    assert job.id in await store.mark_unknown()
    [(number, status, *_)] = await attempt_rows(pool, job.id)
    assert (number, status) == (1, "unknown")
    assert await store.finish(claim, DeliveryStatus.DELIVERED, 204, None, duration_ms=30)
    assert await attempt_rows(pool, job.id) == [(1, "delivered", 204, None, 30, False)]


async def test_a_retrying_delivery_is_claimed_once_when_due_and_counts_its_own_takeovers(
    pool: asyncpg.Pool,
) -> None:
    job = await new_job(pool, await new_workspace(pool, max_attempts=5))
    store = DeliveryStore(pool, claim_s=30)
    claim = await store.claim(job.id, HOOK, f"msg_{job.id}")
    assert claim is not None
    for number in (1, 2, 3):
        assert await store.start_post(claim) == Attempt(
            number, 5, pytest.approx(DAY_S, abs=60), False
        )
        assert await store.finish(
            claim, DeliveryStatus.RETRYING, 503, None, duration_ms=5, retry_in_s=3600
        )
        assert job.id not in due_ids(await store.deferred(64, 4)), "not due for an hour"
        await make_due(pool, job.id)
        assert job.id in due_ids(await store.deferred(64, 4))
        stale, claim = claim, await store.claim_deferred(job.id)
        assert claim == Claim(job.id, number + 1)
        assert await store.claim_deferred(job.id) is None
        assert not await store.start_post(stale), "an earlier claim may not POST again"
    # Claim 4 is the first of its attempt: its notifier dying is a first takeover.
    await expire_delivery_claim(pool, job.id)
    assert Claim(job.id, 5) in await store.reclaim_expired()
    assert not await store.start_post(claim)
    assert await delivery(pool, job.id) == ("sending", 3, 5)
    assert [r[:3] for r in await attempt_rows(pool, job.id)] == [
        (1, "failed", 503),
        (2, "failed", 503),
        (3, "failed", 503),
    ]


async def test_a_redelivery_re_arms_an_ended_delivery_and_is_refused_while_one_is_under_way(
    pool: asyncpg.Pool,
) -> None:
    job = await new_job(pool, await new_workspace(pool, max_attempts=3))
    store, log = DeliveryStore(pool, claim_s=30), DeliveryLog(pool)
    claim = await store.claim(job.id, HOOK, f"msg_{job.id}")
    assert claim is not None and await store.start_post(claim)
    with pytest.raises(ConflictError, match="posting"):
        await log.request_redelivery(job)
    assert await store.finish(claim, DeliveryStatus.DELIVERED, 204, None, duration_ms=3)
    with pytest.raises(ConflictError, match=r"ended 0\.\d s ago; a redelivery may be asked"):
        await log.request_redelivery(job)
    await ended_long_ago(pool, job.id)

    scheduled = await log.request_redelivery(job)
    assert scheduled.status == "retrying"
    again = await log.request_redelivery(job)  # asked twice before it went: still one
    assert again.status == "retrying" and again.next_attempt_at >= scheduled.next_attempt_at
    page = await log.attempts(job.id, 0, 100)
    assert (page.status, page.next_attempt_at) == ("retrying", again.next_attempt_at)
    redelivered = await store.claim_deferred(job.id)
    assert redelivered == Claim(job.id, 2)
    with pytest.raises(ConflictError, match="sending"):
        await log.request_redelivery(job)
    attempt = await store.start_post(redelivered)
    assert attempt is not None
    assert (attempt.number, attempt.redelivery) == (2, True)
    assert not await store.finish(claim, DeliveryStatus.FAILED, 500, None), "fenced"
    assert await store.finish(redelivered, DeliveryStatus.FAILED, 500, None, duration_ms=4)
    assert await attempt_rows(pool, job.id) == [
        (1, "delivered", 204, None, 3, False),
        (2, "failed", 500, None, 4, True),
    ]
    first = await log.attempts(job.id, 0, 1)
    assert [a.attempt for a in first.attempts] == [1] and first.has_more
    rest = await log.attempts(job.id, 1, 1)
    assert [a.attempt for a in rest.attempts] == [2] and not rest.has_more


async def test_a_redelivery_re_arms_an_unknown_attempt_and_fences_its_silent_holder(
    pool: asyncpg.Pool,
) -> None:
    job = await new_job(pool, await new_workspace(pool))
    store, log = DeliveryStore(pool, claim_s=30), DeliveryLog(pool)
    silent = await store.claim(job.id, HOOK, f"msg_{job.id}")
    assert silent is not None and await store.start_post(silent)
    await expire_delivery_claim(pool, job.id)
    await store.mark_unknown()
    await log.request_redelivery(job)
    assert not await store.finish(silent, DeliveryStatus.DELIVERED, 204, None)
    assert await delivery(pool, job.id) == ("retrying", 1, 1)
    assert [r[:2] for r in await attempt_rows(pool, job.id)] == [(1, "unknown")]


async def test_a_redelivery_before_any_delivery_is_the_ordinary_first_one(
    pool: asyncpg.Pool,
) -> None:
    # Stored as the first delivery (not a redelivery, no window yet), so a workspace that
    # opted in retries it; asked again while it waits unclaimed: the same, one POST.
    job = await new_job(pool, await new_workspace(pool, max_attempts=3))
    store, log = DeliveryStore(pool, claim_s=30), DeliveryLog(pool)
    scheduled = await log.request_redelivery(job)
    row = await stored(pool, job.id)
    assert (row["status"], row["deferred"], row["redelivery"], row["retry_until"]) == (
        "sending",
        True,
        False,
        None,
    )
    assert (scheduled.status, scheduled.next_attempt_at) == ("sending", row["next_attempt_at"])
    page = await log.attempts(job.id, 0, 100)
    assert (page.status, page.next_attempt_at, page.attempts) == (
        "sending",
        scheduled.next_attempt_at,
        [],
    )
    again = await log.request_redelivery(job)
    assert again == scheduled
    # The job.finished handled afterwards finds it claimed; the deferred pass POSTs it.
    assert await store.claim(job.id, HOOK, f"msg_{job.id}") is None
    assert job.id in due_ids(await store.deferred(64, 4))
    claim = await store.claim_deferred(job.id)
    assert claim == Claim(job.id, 1)
    with pytest.raises(ConflictError, match=r"in progress \(delivery sending\)"):
        await log.request_redelivery(job)  # claimed now: an attempt is under way
    attempt = await store.start_post(claim)
    assert attempt == Attempt(1, 3, pytest.approx(DAY_S, abs=60), False)
    assert await store.finish(claim, DeliveryStatus.RETRYING, 500, None, retry_in_s=60)
    assert await attempt_rows(pool, job.id) == [(1, "failed", 500, None, None, False)]


async def test_a_redelivery_of_a_delivery_the_notifier_deferred_keeps_it_and_posts_once(
    pool: asyncpg.Pool,
) -> None:
    job = await new_job(pool, await new_workspace(pool))
    store, log = DeliveryStore(pool, claim_s=30), DeliveryLog(pool)
    assert await store.defer(job.id, HOOK, f"msg_{job.id}")
    first = await log.request_redelivery(job)
    second = await log.request_redelivery(job)
    assert first == second and first.status == "sending"
    page = await log.attempts(job.id, 0, 100)
    assert (page.status, page.next_attempt_at) == ("sending", first.next_attempt_at)
    row = await stored(pool, job.id)
    assert (row["deferred"], row["redelivery"], row["attempts"]) == (True, False, 0)
    assert await store.claim_deferred(job.id) == Claim(job.id, 1)
    assert await store.claim_deferred(job.id) is None


async def test_a_redelivery_of_a_pending_automatic_retry_only_makes_it_due_now(
    pool: asyncpg.Pool,
) -> None:
    job = await new_job(pool, await new_workspace(pool, max_attempts=3))
    store, log = DeliveryStore(pool, claim_s=30), DeliveryLog(pool)
    claim = await store.claim(job.id, HOOK, f"msg_{job.id}")
    assert claim is not None and await store.start_post(claim)
    assert await store.finish(claim, DeliveryStatus.RETRYING, 503, None, retry_in_s=3600)
    window = (await stored(pool, job.id))["retry_until"]
    scheduled = await log.request_redelivery(job)  # within 10 s of the end: adds no attempt
    row = await stored(pool, job.id)
    assert (row["status"], row["redelivery"], row["retry_until"]) == ("retrying", False, window)
    assert scheduled == Scheduled("retrying", row["next_attempt_at"])
    assert row["next_attempt_at"] <= row["now"]
    assert job.id in due_ids(await store.deferred(64, 4))
    retry = await store.claim_deferred(job.id)
    assert retry == Claim(job.id, 2)
    attempt = await store.start_post(retry)
    # Its retries are kept: attempt 2 of 3, in the window of the first attempt.
    assert attempt is not None and (attempt.number, attempt.max_attempts) == (2, 3)
    assert not attempt.redelivery and DAY_S - 60 < attempt.retry_window_s <= DAY_S


async def test_the_retry_window_starts_at_the_first_attempt_not_at_the_claim(
    pool: asyncpg.Pool,
) -> None:
    store = DeliveryStore(pool, claim_s=30)
    claimed = await new_job(pool, await new_workspace(pool, max_attempts=3))
    deferred = await new_job(pool, await new_workspace(pool, max_attempts=3))
    claim = await store.claim(claimed.id, HOOK, f"msg_{claimed.id}")
    assert claim is not None and await store.defer(deferred.id, HOOK, f"msg_{deferred.id}")
    assert (await stored(pool, claimed.id))["retry_until"] is None
    assert (await stored(pool, deferred.id))["retry_until"] is None
    # Deferred for two hours before its receiver had room: the window is still 24 h.
    await pool.execute(
        "UPDATE webhook_deliveries SET created_at = now() - interval '2h' WHERE batch_id = $1",
        deferred.id,
    )
    late = await store.claim_deferred(deferred.id)
    assert late is not None
    for held in (claim, late):
        attempt = await store.start_post(held)
        assert attempt is not None and DAY_S - 60 < attempt.retry_window_s <= DAY_S
        row = await stored(pool, held.batch_id)
        assert (row["retry_until"] - row["now"]).total_seconds() == pytest.approx(DAY_S, abs=60)


async def test_redeliveries_are_bounded_by_a_cooldown_and_100_attempts(
    pool: asyncpg.Pool,
) -> None:
    job = await new_job(pool, await new_workspace(pool))
    store, log = DeliveryStore(pool, claim_s=30), DeliveryLog(pool)
    claim = await store.claim(job.id, HOOK, f"msg_{job.id}")
    assert claim is not None and await store.start_post(claim)
    assert await store.finish(claim, DeliveryStatus.FAILED, 500, None, duration_ms=3)
    with pytest.raises(ConflictError, match="a redelivery may be asked for 10 s after it"):
        await log.request_redelivery(job)
    await pool.execute(
        "UPDATE webhook_deliveries SET finished_at = now() - interval '9s' WHERE batch_id = $1",
        job.id,
    )
    with pytest.raises(ConflictError, match=r"ended 9\.\d s ago"):
        await log.request_redelivery(job)
    assert await delivery(pool, job.id) == ("failed", 1, 1), "nothing changed"
    await pool.execute(
        "UPDATE webhook_deliveries SET attempts = 100, finished_at = now() - interval '1h'"
        " WHERE batch_id = $1",
        job.id,
    )
    with pytest.raises(ConflictError, match=r"made 100 attempts, the most a delivery may make"):
        await log.request_redelivery(job)
    await pool.execute("UPDATE webhook_deliveries SET attempts = 99 WHERE batch_id = $1", job.id)
    assert (await log.request_redelivery(job)).status == "retrying"


async def test_the_api_lists_attempts_and_schedules_a_redelivery(
    pool: asyncpg.Pool, client_a: ApiClient, client_b: ApiClient
) -> None:
    workspace = await KeyStore(pool).ensure_workspace("workspace-a")
    jobs = JobStore(pool)
    created = await jobs.create(
        NewJob(new_id(), workspace, NAME, "gpt-4o-mini", 0, 1, HOOK, None, None),
        iter([("c-0", '[{"role":"user","content":"hi"}]')]),
    )
    path = f"/v1/batches/{created.id}/webhook_deliveries"
    assert await client_a.request("GET", path) == (
        200,
        {
            "object": "list",
            "batch_id": created.id,
            "status": None,
            "next_attempt_at": None,
            "data": [],
            "has_more": False,
        },
    )
    status, body = await client_a.request("POST", path)
    assert (status, body["error"]["param"]) == (409, "id"), body  # queued: not terminal
    await jobs.cancel(workspace, created.id)
    status, body = await client_b.request("POST", path)
    assert status == 404, body
    for bad in ("1", f"{created.id}.x", f"{created.id}.", f"{new_id()}.1", f"{created.id}.-1"):
        status, body = await client_a.request("GET", path, params={"after": bad})
        assert (status, body["error"]["param"]) == (400, "after"), (bad, body)
    status, body = await client_a.request("GET", path, params={"limit": "101"})
    assert (status, body["error"]["param"]) == (400, "limit")

    status, body = await client_a.request("POST", path)
    assert status == 202, body
    due = body.pop("next_attempt_at")
    assert due.endswith("Z")
    assert body == {
        "object": "webhook_delivery.scheduled",
        "batch_id": created.id,
        "status": "sending",  # its first delivery, waiting unclaimed
    }
    status, again = await client_a.request("POST", path)  # still waiting: the same, once
    assert (status, again["status"], again["next_attempt_at"]) == (202, "sending", due), again
    status, listed = await client_a.request("GET", path)
    assert (status, listed["status"], listed["next_attempt_at"], listed["data"]) == (
        200,
        "sending",
        due,
        [],
    )
    store = DeliveryStore(pool, claim_s=30)
    claim = await store.claim_deferred(created.id)
    assert claim is not None and await store.start_post(claim)
    status, body = await client_a.request("POST", path)
    assert (status, body["error"]["param"]) == (409, "id")
    assert "in progress (delivery posting)" in body["error"]["message"]
    assert await store.finish(claim, DeliveryStatus.FAILED, 500, None, duration_ms=1)
    status, body = await client_a.request("POST", path)
    assert (status, body["error"]["param"]) == (409, "id")
    assert "a redelivery may be asked for 10 s after it" in body["error"]["message"]
    await ended_long_ago(pool, created.id)
    status, body = await client_a.request("POST", path)
    assert (status, body["status"]) == (202, "retrying"), body
    status, listed = await client_a.request("GET", path)
    assert (listed["status"], listed["next_attempt_at"]) == ("retrying", body["next_attempt_at"])

    no_hook = await new_job(pool, "workspace-a", url=None)
    status, body = await client_a.request("POST", f"/v1/batches/{no_hook.id}/webhook_deliveries")
    assert (status, body["error"]["param"]) == (400, "webhook_url")


async def test_webhook_retries_are_set_per_workspace_from_1_to_20(
    iso: Isolation, pool: asyncpg.Pool
) -> None:
    name = f"retries-{new_id()[:6]}"
    await KeyStore(pool).ensure_workspace(name)
    command = ("workspaces", "webhook-retries", name, "--max-attempts")
    done = await relay_admin(iso, *command, "20")
    assert (done.returncode, done.stdout) == (
        0,
        f"workspace {name}: webhook max attempts 20"
        " (failed attempts retried with backoff, up to 24 h)\n",
    )
    stored = "SELECT webhook_max_attempts FROM workspaces WHERE name = $1"
    assert await pool.fetchval(stored, name) == 20
    for bad in ("0", "21", "x", "-1", "1" * 400):
        refused = await relay_admin(iso, *command, bad)
        assert refused.returncode == 2, bad
        assert "--max-attempts: must be an integer from 1 to 20" in refused.stderr, bad
    assert await pool.fetchval(stored, name) == 20
    back = await relay_admin(iso, *command, "1")
    assert back.stdout == f"workspace {name}: webhook max attempts 1 (once, no retry)\n"
    missing = await relay_admin(iso, "workspaces", "webhook-retries", "nope", "--max-attempts", "3")
    assert missing.returncode == 1 and "no workspace named 'nope'" in missing.stderr
