"""Results while a job runs, row details and stats, end to end on real processes: what a
user polling a slow batch sees, and what every row says about itself once it ends."""

from __future__ import annotations

from typing import Any

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
    latencies = sorted(row["latency_ms"] for row in detailed if row["latency_ms"] is not None)
    latency = stats["latency"]
    assert latency["count"] == len(latencies)
    assert [b["le_ms"] for b in latency["buckets"]] == [*LATENCY_BOUNDS_MS, None]
    assert sum(b["count"] for b in latency["buckets"]) == len(latencies)
    assert latency["max_ms"] == (latencies[-1] if latencies else None)


def assert_details(i: int, row: dict[str, Any], asked: str) -> None:
    """Row ``i`` of the finished slow batch (whose message was ``asked``) carries every
    detail, with its true values."""
    detail_keys = {"usage", "attempts", "deployment", "latency_ms", "finish_reason"}
    assert detail_keys <= set(row) <= detail_keys | {"custom_id", "content", "error", "cost_usd"}
    assert row["deployment"] == (None if i == FAILING else "sim")
    assert row["latency_ms"] is None or isinstance(row["latency_ms"], int)
    assert "cost_usd" not in row  # the e2e routes file prices nothing
    if i == FAILING:
        assert row["error"].startswith("upstream_error: ") and "HTTP 400" in row["error"]
        assert (row["attempts"], row["finish_reason"]) == (1, None)
        assert row["usage"] == {"prompt_tokens": 0, "completion_tokens": 0}
        return
    assert row["content"] == f"echo: {asked}"
    assert (row["attempts"], row["finish_reason"]) == (2 if i == RETRIED else 1, "stop")
    assert row["usage"]["prompt_tokens"] > 0 and row["usage"]["completion_tokens"] > 0
