"""Results while a job runs, row details and stats, end to end on real processes: what a
user polling a slow batch sees, and what every row says about itself once it ends."""

from __future__ import annotations

from typing import Any

import pytest

from relay_batches.ledger.job_stats import INTERVALS_S, LATENCY_BOUNDS_MS, MAX_INTERVALS
from tests.helpers.support import ApiClient, rows, wait_until

TOTAL = 24
SLOW = range(16, TOTAL)  # held back by the simulator while the others finish
SLOW_MS = 4000
FAILING = 3  # refused by the upstream: an error row
RETRIED = 5  # fails once, then answers: two attempts


def slow_batch() -> dict[str, Any]:
    """A batch of TOTAL rows whose last ones take SLOW_MS each, one refused, one retried."""
    requests = rows(TOTAL)
    for i in SLOW:
        requests[i]["messages"][0]["content"] = f"row {i} [sim:delay-ms={SLOW_MS}]"
    requests[FAILING]["messages"][0]["content"] = f"row {FAILING} [sim:status=400]"
    requests[RETRIED]["messages"][0]["content"] = f"row {RETRIED} [sim:fail-first=1]"
    return {"model": "gpt-4o-mini", "requests": requests}


async def get_ok(api: ApiClient, path: str) -> Any:
    """GET ``path`` and insist on 200."""
    status, body = await api.request("GET", path)
    assert status == 200, (status, body)
    return body


async def test_partial_results_mid_run_then_details_and_stats_of_every_row(
    api: ApiClient,
) -> None:
    body = slow_batch()
    created = await api.submit(body)
    batch_id = created["id"]
    results = f"/v1/batches/{batch_id}/results"

    async def fast_rows_done() -> dict[str, Any] | None:
        batch = await api.get(batch_id)
        return batch if batch["completed"] + batch["failed"] >= len(range(SLOW.start)) else None

    # Mid-run: the fast rows are in, the slow ones are held by the simulator for seconds.
    await wait_until(fast_rows_done, 30, "the fast rows to finish", 0.1)
    partial = await get_ok(api, results + "?partial=true")
    plain = await get_ok(api, results)
    assert partial["status"] == "running" and partial["partial"] is True
    seen = [row["custom_id"] for row in partial["data"]]
    assert seen[: SLOW.start] == [f"r-{i}" for i in range(SLOW.start)]
    assert len(seen) < TOTAL  # the slow rows are not in yet
    assert partial["data"][0] == {"custom_id": "r-0", "content": "echo: row 0"}
    assert plain == {"id": batch_id, "status": "running", "data": []}

    done = await api.wait_status(batch_id, {"completed"}, timeout=60)
    assert (done["completed"], done["failed"]) == (TOTAL - 1, 1)
    detailed = (await get_ok(api, results + "?include=details"))["data"]
    assert [row["custom_id"] for row in detailed] == [f"r-{i}" for i in range(TOTAL)]
    for i, row in enumerate(detailed):
        assert_details(i, row, body["requests"][i]["messages"][0]["content"])
    assert (await get_ok(api, results + "?partial=true"))["data"] == [
        {k: v for k, v in row.items() if k in ("custom_id", "content", "error")} for row in detailed
    ]

    stats = await get_ok(api, f"/v1/batches/{batch_id}/stats")
    assert (stats["object"], stats["status"]) == ("batch.stats", "completed")
    assert stats["started_at"] == done["started_at"]
    assert stats["interval_s"] in INTERVALS_S
    assert 1 <= len(stats["progress"]) <= MAX_INTERVALS
    assert sum(i["completed"] for i in stats["progress"]) == TOTAL - 1
    assert sum(i["failed"] for i in stats["progress"]) == 1
    latencies = sorted(row["latency_ms"] for row in detailed)
    latency = stats["latency"]
    assert latency["count"] == TOTAL
    assert [b["le_ms"] for b in latency["buckets"]] == [*LATENCY_BOUNDS_MS, None]
    assert sum(b["count"] for b in latency["buckets"]) == TOTAL
    assert latency["max_ms"] == latencies[-1] >= SLOW_MS
    assert latency["p50_ms"] == latencies[TOTAL // 2 - 1] < SLOW_MS  # most rows are fast
    assert latency["p90_ms"] >= SLOW_MS  # a third of them are slow


def assert_details(i: int, row: dict[str, Any], asked: str) -> None:
    """Row ``i`` of the finished slow batch (whose message was ``asked``) carries every
    detail, with its true values."""
    detail_keys = {"usage", "attempts", "deployment", "latency_ms", "finish_reason"}
    assert detail_keys <= set(row) <= detail_keys | {"custom_id", "content", "error", "cost_usd"}
    assert row["deployment"] == (None if i == FAILING else "sim")
    assert isinstance(row["latency_ms"], int) and row["latency_ms"] >= 0
    assert row["latency_ms"] >= SLOW_MS or i not in SLOW
    assert "cost_usd" not in row  # the deployment of gpt-4o-mini has no price
    if i == FAILING:
        assert row["error"].startswith("upstream_error: ") and "HTTP 400" in row["error"]
        assert (row["attempts"], row["finish_reason"]) == (1, None)
        assert row["usage"] == {"prompt_tokens": 0, "completion_tokens": 0}
        return
    assert row["content"] == f"echo: {asked}"
    assert (row["attempts"], row["finish_reason"]) == (2 if i == RETRIED else 1, "stop")
    assert row["usage"]["prompt_tokens"] > 0 and row["usage"]["completion_tokens"] > 0


async def test_rows_of_a_priced_deployment_show_their_cost(api: ApiClient) -> None:
    requests = rows(3)
    requests[1]["messages"][0]["content"] = "row 1 [sim:status=400]"
    created = await api.submit({"model": "sim-priced", "requests": requests})
    done = await api.wait_status(created["id"], {"completed"}, timeout=30)
    data = (await get_ok(api, f"/v1/batches/{created['id']}/results?include=details"))["data"]
    assert "cost_usd" not in data[1]  # an error: no deployment answered, nothing to price
    for row in (data[0], data[2]):
        usage = row["usage"]
        # The e2e routes price sim-priced at 1000 and 2000 USD per million tokens.
        expected = (usage["prompt_tokens"] * 1000 + usage["completion_tokens"] * 2000) / 1e6
        assert row["cost_usd"] == pytest.approx(expected) and row["cost_usd"] > 0
        assert row["deployment"] == "sim-priced"
    assert done["cost_usd"] == pytest.approx(data[0]["cost_usd"] + data[2]["cost_usd"])
