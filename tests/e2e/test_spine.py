"""The spine end to end: every service its own process, driven over HTTP like a user."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.helpers.processes import System, sim_calls
from tests.helpers.support import (
    ApiClient,
    WebhookReceiver,
    rows,
    rows_queue_depth,
    wait_until,
)

API_EXAMPLE = {
    "name": "Review sentiment — October",
    "model": "gpt-4o-mini",
    "requests": [
        {"custom_id": "r-1", "messages": [{"role": "user", "content": "Classify: great product!"}]},
        {
            "custom_id": "r-2",
            "messages": [{"role": "user", "content": "Classify: terrible service"}],
        },
    ],
    "priority": 5,
    "cron": None,
}


async def test_api_example_completes_with_exact_results_and_webhook(
    api: ApiClient, webhooks: WebhookReceiver
) -> None:
    created = await api.submit({**API_EXAMPLE, "webhookUrl": webhooks.url})
    assert created["status"] == "queued"
    assert created["total"] == 2
    assert created["next_run_at"] is None
    assert set(created) >= {"id", "object", "status", "total", "next_run_at"}

    batch = await api.wait_status(created["id"], {"completed"}, timeout=30)
    assert (batch["completed"], batch["failed"], batch["dead_letter"]) == (2, 0, 0)
    assert await api.results(created["id"]) == {
        "id": created["id"],
        "status": "completed",
        "data": [
            {"custom_id": "r-1", "content": "echo: Classify: great product!"},
            {"custom_id": "r-2", "content": "echo: Classify: terrible service"},
        ],
    }
    await wait_until(lambda: _some(webhooks.for_batch(created["id"])), 15, "the completion webhook")
    assert webhooks.for_batch(created["id"]) == [
        {
            "id": created["id"],
            "name": "Review sentiment — October",
            "status": "completed",
            "total": 2,
            "completed": 2,
            "failed": 0,
            "dead_letter": 0,
            "completed_at": batch["completed_at"],
            "cost_usd": 0,
            # Unpriced deployments (the simulator's): nothing saved, every row realtime.
            "cached_tokens": 0,
            "saving": {"all_realtime_usd": 0, "saved_usd": 0, "saved_fraction": None},
            "lanes": {
                "batch": {"rows": 0, "cost_usd": 0},
                "flex": {"rows": 0, "cost_usd": 0},
                "realtime": {"rows": 2, "cost_usd": 0},
            },
        }
    ]


async def _some(items: list[object]) -> bool:
    return bool(items)


async def test_two_thousand_rows_complete_in_submission_order(api: ApiClient) -> None:
    created = await api.submit({"model": "gpt-4o-mini", "requests": rows(2000)})
    batch = await api.wait_status(created["id"], {"completed"}, timeout=120)
    assert (batch["total"], batch["completed"], batch["failed"]) == (2000, 2000, 0)
    results = await api.results(created["id"])
    assert results["data"] == [
        {"custom_id": f"r-{i}", "content": f"echo: row {i}"} for i in range(2000)
    ]

    status, lines = await _ndjson(api, created["id"])
    assert status == 200
    assert lines == results["data"]


async def _ndjson(api: ApiClient, batch_id: str) -> tuple[int, list[object]]:
    import orjson

    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{api.base_url}/v1/batches/{batch_id}/results",
            headers={"Authorization": f"Bearer {api.key}", "Accept": "application/x-ndjson"},
        ) as response,
    ):
        assert response.headers["Content-Type"].startswith("application/x-ndjson")
        body = await response.read()
        return response.status, [orjson.loads(line) for line in body.splitlines()]


async def test_permanent_row_failures_leave_the_job_completed(api: ApiClient) -> None:
    requests = rows(6)
    for i in (1, 4):
        requests[i]["messages"][0]["content"] = f"row {i} [sim:status=400]"
    created = await api.submit({"model": "gpt-4o-mini", "requests": requests})
    batch = await api.wait_status(created["id"], {"completed"}, timeout=30)
    assert (batch["completed"], batch["failed"], batch["dead_letter"]) == (4, 2, 0)
    data = (await api.results(created["id"]))["data"]
    assert [row["custom_id"] for row in data] == [f"r-{i}" for i in range(6)]
    for i in (1, 4):
        assert set(data[i]) == {"custom_id", "error"}
        assert data[i]["error"].startswith("upstream_error: ")
        assert "HTTP 400" in data[i]["error"]
    for i in (0, 2, 3, 5):
        assert data[i] == {"custom_id": f"r-{i}", "content": f"echo: row {i}"}


async def test_cancel_of_a_running_batch_stops_its_rows(
    api: ApiClient, system: System, http: aiohttp.ClientSession, webhooks: WebhookReceiver
) -> None:
    calls_before = await sim_calls(http, system)
    created = await api.submit(
        {
            "model": "gpt-4o-mini",
            "requests": rows(5000, "slow row {i} [sim:delay-ms=100]"),
            "webhookUrl": webhooks.url,
        }
    )
    batch_id = created["id"]

    async def some_done() -> bool:
        batch = await api.get(batch_id)
        return batch["status"] == "running" and batch["completed"] >= 16

    await wait_until(some_done, 30, "the slow batch to make progress")
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, canceled = await api.request("POST", f"/v1/batches/{batch_id}/cancel")
    assert status == 200
    assert canceled["status"] == "canceled"
    assert loop.time() - started < 2.0
    assert (await api.get(batch_id))["status"] == "canceled"

    async def drained() -> bool:
        return await rows_queue_depth(system.iso.namespace) == 0

    await wait_until(drained, 30, "the canceled job's rows to leave the broker")
    await wait_until(lambda: _some(webhooks.for_batch(batch_id)), 15, "the cancel webhook")
    calls = await sim_calls(http, system) - calls_before
    assert calls < 5000 // 5, f"{calls} upstream calls for a batch canceled early"

    final = await api.get(batch_id)
    assert final["status"] == "canceled"
    assert (final["completed"], final["failed"]) == (canceled["completed"], canceled["failed"])
    data = (await api.results(batch_id))["data"]
    assert len(data) == final["completed"] + final["failed"]
    for row in data:
        index = int(row["custom_id"].split("-")[1])
        assert row == {
            "custom_id": f"r-{index}",
            "content": f"echo: slow row {index} [sim:delay-ms=100]",
        }
    [hook] = webhooks.for_batch(batch_id)
    assert hook["status"] == "canceled"
    assert (hook["completed"], hook["failed"]) == (final["completed"], final["failed"])

    status, again = await api.request("POST", f"/v1/batches/{batch_id}/cancel")
    assert status == 409
    assert again["error"]["type"] == "conflict_error"


async def test_a_high_priority_batch_overtakes_a_running_low_priority_one(
    api: ApiClient,
) -> None:
    low = await api.submit(
        {"model": "gpt-4o-mini", "priority": 0, "requests": rows(2000, "low {i} [sim:delay-ms=20]")}
    )

    async def low_running() -> bool:
        batch = await api.get(low["id"])
        return batch["status"] == "running" and batch["completed"] >= 50

    await wait_until(low_running, 30, "the low-priority batch to run")
    high = await api.submit({"model": "gpt-4o-mini", "priority": 9, "requests": rows(40)})
    await api.wait_status(high["id"], {"completed"}, timeout=30)
    low_now = await api.get(low["id"])
    assert low_now["status"] == "running", "the priority-0 batch finished first"
    assert low_now["completed"] < 2000
    done = await api.wait_status(low["id"], {"completed"}, timeout=120)
    assert done["completed"] == 2000
