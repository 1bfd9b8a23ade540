"""Steering a running batch end to end, every service its own process: a pause stops the
release of rows (the counters stand still once the rows already released are in), a
resume finishes every row exactly once; a paused batch can be canceled; a row that
failed every attempt is retried as a new batch of that row alone, and succeeds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from relay_batches.ids import new_id
from tests.helpers.checks import assert_exactly_once
from tests.helpers.processes import System
from tests.helpers.support import ApiClient, rows, wait_until

SLOW = "row {i} [sim:delay-ms=20]"
STILL_S = 3.0


async def post(api: ApiClient, batch_id: str, verb: str, **kw: Any) -> tuple[int, Any]:
    return await api.request("POST", f"/v1/batches/{batch_id}/{verb}", **kw)


async def settled(api: ApiClient, batch_id: str) -> dict[str, Any]:
    """The paused batch once its counters stopped moving (a second apart): the rows
    released before the pause are in."""
    last: list[int] = []

    async def unchanged() -> dict[str, Any] | None:
        batch = await api.get(batch_id)
        last.append(batch["completed"] + batch["failed"])
        return batch if len(last) > 1 and last[-1] == last[-2] else None

    return await wait_until(unchanged, 30, f"the paused batch {batch_id} to settle", 1.0)


async def stands_still(api: ApiClient, batch_id: str, seconds: float) -> set[tuple[Any, ...]]:
    """Every (status, completed, failed, rows_per_s) the batch showed over ``seconds``."""
    seen: set[tuple[Any, ...]] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batch = await api.get(batch_id)
        seen.add((batch["status"], batch["completed"], batch["failed"], batch["rows_per_s"]))
        await asyncio.sleep(0.25)  # sampling a stretch of time, not waiting for a change
    return seen


async def test_pause_holds_a_running_batch_still_and_resume_finishes_every_row_once(
    api: ApiClient, system: System
) -> None:
    total = 800
    created = await api.submit({"model": "gpt-4o-mini", "requests": rows(total, SLOW)})
    batch_id = created["id"]
    running = await api.wait_status(batch_id, {"running"}, timeout=30)
    status, body = await post(api, batch_id, "retry")
    assert (status, body["error"]["param"]) == (409, "id")

    status, paused = await post(api, batch_id, "pause")

    assert (status, paused["status"]) == (200, "paused")
    frozen = await settled(api, batch_id)
    assert frozen["status"] == "paused"
    done = frozen["completed"] + frozen["failed"]
    assert done < total, "the batch finished: the pause released nothing less"
    still = await stands_still(api, batch_id, STILL_S)
    assert still == {("paused", frozen["completed"], frozen["failed"], None)}
    status, body = await post(api, batch_id, "pause")
    assert (status, body["error"]["param"]) == (409, "id")

    status, resumed = await post(api, batch_id, "resume")
    assert (status, resumed["status"]) == (200, "queued")
    again = await api.wait_status(batch_id, {"running", "completed"}, timeout=30)
    status, body = await post(api, batch_id, "resume")
    assert (status, body["error"]["param"]) == (409, "id"), again["status"]

    await api.wait_status(batch_id, {"completed"}, timeout=60)
    await assert_exactly_once(
        api,
        system.iso.database_url,
        batch_id,
        [f"r-{i}" for i in range(total)],
        contents=[f"echo: {SLOW.format(i=i)}" for i in range(total)],
    )
    ended = await api.get(batch_id)
    assert ended["started_at"] == running["started_at"]
    status, body = await post(api, batch_id, "pause")
    assert (status, body["error"]["param"]) == (409, "id")


async def test_a_paused_batch_can_be_canceled(api: ApiClient) -> None:
    created = await api.submit({"model": "gpt-4o-mini", "requests": rows(400, SLOW)})
    await api.wait_status(created["id"], {"running"}, timeout=30)
    status, _ = await post(api, created["id"], "pause")
    assert status == 200

    status, canceled = await post(api, created["id"], "cancel")

    assert (status, canceled["status"]) == (200, "canceled")
    ended = await settled(api, created["id"])
    assert ended["status"] == "canceled"
    assert ended["completed"] + ended["failed"] < ended["total"]
    status, body = await post(api, created["id"], "resume")
    assert (status, body["error"]["param"]) == (409, "id")


async def test_a_dead_lettered_row_is_retried_alone_and_succeeds(api: ApiClient) -> None:
    flaky = f"flaky {new_id()[:8]} [sim:fail-first=4]"  # 4 attempts (3 retries) all fail
    requests = rows(3)
    requests[1] = {"custom_id": "r-1", "messages": [{"role": "user", "content": flaky}]}
    created = await api.submit(
        {"name": "retry me", "model": "gpt-4o-mini", "requests": requests, "priority": 4}
    )
    original = await api.wait_status(created["id"], {"completed"}, timeout=60)
    assert (original["completed"], original["failed"], original["dead_letter"]) == (2, 1, 1)
    status, dead = await api.request("GET", f"/v1/batches/{created['id']}/dead_letter")
    assert status == 200
    assert [(r["custom_id"], r["attempts"]) for r in dead["data"]] == [("r-1", 4)]

    status, retry = await post(api, created["id"], "retry", json={"rows": "dead_letter"})

    assert status == 201, retry
    assert (retry["total"], retry["retry_of"], retry["name"], retry["priority"]) == (
        1,
        created["id"],
        "retry me",
        4,
    )
    assert (await api.get(created["id"]))["retries"] == [retry["id"]]
    done = await api.wait_status(retry["id"], {"completed"}, timeout=30)
    assert (done["completed"], done["failed"]) == (1, 0)
    assert (await api.results(retry["id"]))["data"] == [
        {"custom_id": "r-1", "content": f"echo: {flaky}"}
    ]
    status, body = await post(api, retry["id"], "retry")  # nothing failed
    assert (status, body["error"]["param"]) == (400, "rows")
