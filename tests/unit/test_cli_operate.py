"""``relay batch retry|pause|resume|deliveries|redeliver|delete`` and the cost in ``status``:
parsing and output, on a fake client (no servers)."""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

import pytest

from relay_batches.services.relay_cli.__main__ import _parser
from relay_batches.services.relay_cli.batch import (
    COMMANDS,
    delivery_line,
    delivery_state,
    status,
)

BATCH_ID = "b" * 32
NEW_ID = "c" * 32


def parse(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["batch", *argv])


class FakeClient:
    """Records the calls; answers what the API would."""

    def __init__(self, pages: list[dict[str, Any]] | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.pages = pages or []

    async def retry(self, batch_id: str, rows: str) -> dict[str, Any]:
        self.calls.append(("retry", batch_id, rows))
        return {"id": NEW_ID, "status": "queued", "total": 3, "name": "nightly"}

    async def pause(self, batch_id: str) -> dict[str, Any]:
        self.calls.append(("pause", batch_id))
        return {"id": batch_id, "status": "paused"}

    async def resume(self, batch_id: str) -> dict[str, Any]:
        self.calls.append(("resume", batch_id))
        return {"id": batch_id, "status": "queued"}

    async def delete(self, batch_id: str) -> dict[str, Any]:
        self.calls.append(("delete", batch_id))
        return {"id": batch_id, "object": "batch.deleted", "deleted": True}

    async def redeliver(self, batch_id: str) -> dict[str, Any]:
        self.calls.append(("redeliver", batch_id))
        return {
            "object": "webhook_delivery.scheduled",
            "batch_id": batch_id,
            "status": "retrying",
            "next_attempt_at": "2030-01-01T12:00:01Z",
        }

    async def deliveries(self, batch_id: str, limit: int, after: str | None) -> dict[str, Any]:
        self.calls.append(("deliveries", batch_id, limit, after))
        return self.pages.pop(0)


async def run(client: FakeClient, *argv: str) -> tuple[int, str, str]:
    args = parse(*argv)
    out, err = io.StringIO(), io.StringIO()
    code = await COMMANDS[args.batch_command](client, args, out, err)  # type: ignore[arg-type]
    return code, out.getvalue(), err.getvalue()


def attempt(n: int, **fields: Any) -> dict[str, Any]:
    base = {
        "id": f"{BATCH_ID}.{n}",
        "object": "webhook_delivery",
        "attempt": n,
        "status": "failed",
        "response_status": 500,
        "error": "HTTP 500",
        "attempted_at": f"2030-01-01T12:00:0{n}Z",
        "duration_ms": 12,
        "redelivery": False,
    }
    return {**base, **fields}


def test_retry_takes_failed_by_default_and_only_the_two_row_sets() -> None:
    assert parse("retry", BATCH_ID).rows == "failed"
    assert parse("retry", BATCH_ID, "--rows", "dead_letter").rows == "dead_letter"
    with pytest.raises(SystemExit) as exited:
        parse("retry", BATCH_ID, "--rows", "all")
    assert exited.value.code == 2  # a usage error


async def test_retry_prints_the_new_job_line_like_submit() -> None:
    client = FakeClient()
    code, out, _ = await run(client, "retry", BATCH_ID, "--rows", "dead_letter")
    assert (code, out) == (0, f"{NEW_ID}  queued  3 rows  nightly\n")
    assert client.calls == [("retry", BATCH_ID, "dead_letter")]


async def test_pause_resume_and_redeliver_print_one_line_each() -> None:
    client = FakeClient()
    assert await run(client, "pause", BATCH_ID) == (0, f"{BATCH_ID}  paused\n", "")
    assert await run(client, "resume", BATCH_ID) == (0, f"{BATCH_ID}  queued\n", "")
    assert await run(client, "redeliver", BATCH_ID) == (
        0,
        f"{BATCH_ID}  retrying  next attempt 2030-01-01T12:00:01Z\n",
        "",
    )
    assert [c[0] for c in client.calls] == ["pause", "resume", "redeliver"]


async def test_delete_prints_the_deleted_id_and_takes_exactly_one_id() -> None:
    client = FakeClient()
    assert await run(client, "delete", BATCH_ID) == (0, f"{BATCH_ID}  deleted\n", "")
    assert client.calls == [("delete", BATCH_ID)]
    with pytest.raises(SystemExit) as exited:
        parse("delete")
    assert exited.value.code == 2  # a usage error


def test_a_delivery_line_per_attempt_with_dashes_for_the_unknown() -> None:
    assert delivery_line(attempt(1)) == (
        "  1  failed     500     12 ms  2030-01-01T12:00:01Z  first       HTTP 500"
    )
    unknown = attempt(2, status="unknown", response_status=None, duration_ms=None, error=None)
    assert delivery_line(unknown) == (
        "  2  unknown      -         -  2030-01-01T12:00:02Z  retry       -"
    )
    again = attempt(3, status="delivered", response_status=204, error=None, redelivery=True)
    assert delivery_line(again).split() == [
        "3",
        "delivered",
        "204",
        "12",
        "ms",
        "2030-01-01T12:00:03Z",
        "redelivery",
        "-",
    ]


async def test_deliveries_pages_through_every_attempt_and_states_the_delivery() -> None:
    first = {
        "batch_id": BATCH_ID,
        "status": "retrying",
        "next_attempt_at": "2030-01-01T12:01:00Z",
        "data": [attempt(1), attempt(2)],
        "has_more": True,
    }
    second = {**first, "data": [attempt(3)], "has_more": False}
    client = FakeClient([first, second])
    code, out, err = await run(client, "deliveries", BATCH_ID)
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == ["1", "2", "3"]
    assert client.calls == [
        ("deliveries", BATCH_ID, 100, None),
        ("deliveries", BATCH_ID, 100, f"{BATCH_ID}.2"),
    ]
    assert err == f"{BATCH_ID}: delivery retrying, next attempt 2030-01-01T12:01:00Z\n"


def test_delivery_state_without_a_delivery() -> None:
    page = {"batch_id": BATCH_ID, "status": None, "next_attempt_at": None, "data": []}
    assert delivery_state(page) == f"{BATCH_ID}: no webhook delivery"
    assert delivery_state({**page, "status": "delivered"}) == f"{BATCH_ID}: delivery delivered"


class OneBatch:
    def __init__(self, batch: dict[str, Any]) -> None:
        self.batch = batch

    async def get(self, batch_id: str) -> dict[str, Any]:
        return self.batch


async def test_status_shows_cost_budget_rate_eta_and_the_retry_links() -> None:
    running = {
        "id": BATCH_ID,
        "name": "nightly",
        "status": "running",
        "model": "gpt-4o-mini",
        "priority": 0,
        "total": 100,
        "completed": 40,
        "failed": 0,
        "dead_letter": 0,
        "created_at": "2030-01-01T12:00:00Z",
        "started_at": "2030-01-01T12:00:01Z",
        "completed_at": None,
        "cost_usd": 0.0123,
        "budget_usd": 5.0,
        "rows_per_s": 12.5,
        "eta_s": 5,
        "retry_of": NEW_ID,
        "retries": [],
    }
    out = io.StringIO()
    args = argparse.Namespace(id=BATCH_ID, json=False)
    assert await status(OneBatch(running), args, out, io.StringIO()) == 0  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    assert "cost      $0.0123 of $5.00 budget" in lines
    assert "rate      12.5 rows/s" in lines
    assert "eta       0:05" in lines
    assert f"retry of  {NEW_ID}" in lines
    assert not any(line.startswith("retries") for line in lines)

    ended = {**running, "status": "failed", "budget_usd": None, "rows_per_s": None, "eta_s": None}
    ended["retries"] = [NEW_ID, "d" * 32]
    out = io.StringIO()
    assert await status(OneBatch(ended), args, out, io.StringIO()) == 0  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    assert "cost      $0.0123" in lines
    assert f"retries   {NEW_ID} {'d' * 32}" in lines
    assert not any(line.startswith(("rate", "eta")) for line in lines)


class Uploads:
    def __init__(self) -> None:
        self.fields: dict[str, str] = {}

    async def upload(self, files: list[Any], fields: dict[str, str]) -> list[dict[str, Any]]:
        self.fields = fields
        return [{"id": NEW_ID, "status": "queued", "total": 1, "name": "a.csv"}]


async def test_submit_budget_is_the_budget_usd_form_field(tmp_path: Path) -> None:
    source = tmp_path / "a.csv"
    source.write_text("hi\n")
    client = Uploads()
    args = parse("submit", str(source), "--budget", "2.5")
    out = io.StringIO()
    assert await COMMANDS["submit"](client, args, out, io.StringIO()) == 0  # type: ignore[arg-type]
    assert client.fields == {"budget_usd": "2.5"}
    assert out.getvalue() == f"{NEW_ID}  queued  1 rows  a.csv\n"
