"""``relay batch …`` and ``relay models`` as a user runs them (a subprocess talking HTTP to
the e2e system): failed rows in plain sight and the exit codes CI scripts rely on, the
output formats of ``results``, ``dead-letter``, a CSV file with a header row, the
submit options and ``--json``."""

from __future__ import annotations

import csv
import io
import os
import re
from datetime import datetime
from pathlib import Path

import orjson

from relay_batches.ids import new_id
from tests.e2e.test_cli import CLI_TIMEOUT_S, Run, created_ids, relay, slow_requests
from tests.helpers.processes import System
from tests.helpers.support import ApiClient, run_relay, wait_until


async def test_a_job_with_failed_rows_exits_3_and_its_failed_rows_are_one_command_away(
    system: System, api_key: str, api: ApiClient, tmp_path: Path
) -> None:
    flaky = f"[sim:fail-first=4] flaky {new_id()}"  # transient until retries run out
    table = tmp_path / "reviews.csv"
    table.write_text(
        "id,notes,prompt\n"
        "r-1,first,good\n"
        'r-2,second,"bad, [sim:status=400]"\n'
        f"r-3,third,{flaky}\n"
        "r-4,fourth,fine\n"
    )
    run = await relay(
        system, api_key, "submit", str(table), "--model", "gpt-4o-mini", "--id-column", "id",
        "--wait", "--interval", "0.3",
    )  # fmt: skip
    assert run.code == 3, run
    (batch_id,) = created_ids(run)
    batch = await api.get(batch_id)
    assert (batch["status"], batch["failed"], batch["dead_letter"]) == ("completed", 2, 1)
    summary = re.search(
        rf"^{batch_id} completed · 2 failed: 4 rows, 2 ok, 2 failed, 1 dead letter in (\S+),",
        run.err,
        re.M,
    )
    assert summary, run.err
    took = datetime.fromisoformat(batch["completed_at"]) - datetime.fromisoformat(
        batch["started_at"]
    )
    minutes, seconds = divmod(round(took.total_seconds()), 60)
    assert summary[1] == f"{minutes}:{seconds:02d}"  # the job's own time, not the watch's
    assert f"relay batch results {batch_id} --failed" in run.err
    assert run.err.rstrip().endswith("relay: exit 3 (the job completed, but rows failed)")

    status = await relay(system, api_key, "status", batch_id)
    assert re.search(r"^status\s+completed · 2 failed$", status.out, re.M), status.out
    listed = await relay(system, api_key, "list", "--limit", "100")
    line = next(line for line in listed.out.splitlines() if line.startswith(batch_id))
    assert "completed · 2 failed" in line

    failed_csv = tmp_path / "failed.csv"
    run = await relay(system, api_key, "results", batch_id, "--failed", "-o", str(failed_csv))
    assert run.code == 0, run
    assert f"wrote 2 failed rows of {batch_id} (completed · 2 failed)" in run.err
    records = list(csv.DictReader(io.StringIO(failed_csv.read_text())))
    assert [(r["custom_id"], r["content"]) for r in records] == [("r-2", ""), ("r-3", "")]
    assert all(r["error"] for r in records)

    dead = await relay(system, api_key, "dead-letter", batch_id)
    assert dead.code == 0, dead
    assert re.fullmatch(r"r-3  \d+ attempt\(s\)  .+\n", dead.out), dead
    dead_json = await relay(system, api_key, "dead-letter", batch_id, "--json", "--details")
    document = orjson.loads(dead_json.out)
    assert [(r["custom_id"], r["usage"]["completion_tokens"]) for r in document["data"]] == [
        ("r-3", 0)
    ]


async def test_results_write_the_format_their_file_names_with_details(
    system: System, api_key: str, api: ApiClient, tmp_path: Path
) -> None:
    rows = tmp_path / "rows.csv"
    rows.write_text('prompt\none\n"two, three"\n')
    run = await relay(system, api_key, "submit", str(rows), "--model", "gpt-4o-mini", "--wait")
    assert run.code == 0, run
    (batch_id,) = created_ids(run)
    expected = [
        {"custom_id": "row-1", "content": "echo: one"},
        {"custom_id": "row-2", "content": "echo: two, three"},
    ]

    as_json = tmp_path / "out.json"
    assert (await relay(system, api_key, "results", batch_id, "-o", str(as_json))).code == 0
    assert orjson.loads(as_json.read_bytes()) == {
        "id": batch_id,
        "status": "completed",
        "data": expected,
    }
    as_csv = tmp_path / "out.csv"
    run = await relay(system, api_key, "results", batch_id, "-o", str(as_csv), "--details")
    assert run.code == 0 and "(csv)" in run.err, run
    records = list(csv.DictReader(io.StringIO(as_csv.read_text())))
    assert [(r["custom_id"], r["content"]) for r in records] == [
        (e["custom_id"], e["content"]) for e in expected
    ]
    assert all(int(r["attempts"]) == 1 and r["finish_reason"] for r in records)
    forced = tmp_path / "out.txt"
    run = await relay(system, api_key, "results", batch_id, "-o", str(forced))
    assert run.code == 2 and "--format" in run.err and not forced.exists(), run
    run = await relay(system, api_key, "results", batch_id, "-o", str(forced), "--format", "jsonl")
    assert [orjson.loads(line) for line in forced.read_bytes().splitlines()] == expected
    run = await relay(system, api_key, "results", batch_id, "--failed")
    assert (run.code, run.out) == (0, ""), run


async def test_a_canceled_job_exits_4_and_partial_results_show_the_rows_so_far(
    system: System, api_key: str, api: ApiClient
) -> None:
    # More rows than the e2e dispatch window (256): paused, the job keeps the rest back.
    job = await api.submit({"model": "gpt-4o-mini", "requests": slow_requests(600, 50, "p")})

    async def some_done() -> bool:
        return int((await api.get(job["id"]))["completed"]) > 0

    await wait_until(some_done, 30, "a first row to finish")
    assert (await relay(system, api_key, "pause", job["id"])).code == 0
    early = await relay(system, api_key, "results", job["id"])
    assert early.code == 1 and "--partial" in early.err, early
    partial = await relay(system, api_key, "results", job["id"], "--partial")
    assert partial.code == 0, partial
    so_far = [orjson.loads(line) for line in partial.out.splitlines()]
    assert 0 < len(so_far) < 600 and all(r["content"].startswith("echo: ") for r in so_far)
    await relay(system, api_key, "cancel", job["id"])
    watched = await relay(system, api_key, "watch", job["id"], "--json")
    assert watched.code == 4, watched
    assert orjson.loads(watched.out)["status"] == "canceled"
    assert "relay: exit 4 (the job failed, was canceled or expired)" in watched.err


async def test_submit_options_reach_the_job(
    system: System, api_key: str, api: ApiClient, tmp_path: Path
) -> None:
    prompts = tmp_path / "p.csv"
    prompts.write_text("hello\n")
    run = await relay(
        system, api_key, "submit", str(prompts), "--model", "gpt-4o-mini",
        "--param", "top_p=0.5", "--param", 'stop=["END"]', "--temperature", "0.2",
        "--max-tokens", "32", "--metadata", "team=search", "--metadata", "run=7",
        "--completion-window", "2h", "--priority", "4", "--budget", "3",
    )  # fmt: skip
    assert run.code == 0, run
    (batch_id,) = created_ids(run)
    batch = await api.get(batch_id)
    assert batch["params"] == {"top_p": 0.5, "stop": ["END"], "temperature": 0.2, "max_tokens": 32}
    assert batch["metadata"] == {"team": "search", "run": "7"}
    assert (batch["priority"], batch["budget_usd"]) == (4, 3)
    window = datetime.fromisoformat(batch["expires_at"]) - datetime.fromisoformat(
        batch["created_at"]
    )
    assert round(window.total_seconds()) == 7200
    bad = await relay(system, api_key, "submit", str(prompts), "--metadata", "team")
    assert bad.code == 2 and "--metadata takes KEY=VALUE" in bad.err, bad
    bad = await relay(
        system, api_key, "submit", str(prompts), "--model", "gpt-4o-mini", "--id-column", "id"
    )
    assert bad.code == 1 and "no column named 'prompt'" in bad.err, bad


async def test_models_and_json_on_read_commands(
    system: System, api_key: str, api: ApiClient
) -> None:
    env = {**os.environ, "RELAY_URL": system.api_url, "RELAY_API_KEY": api_key}
    code, out, err = await run_relay("models", env=env, timeout_s=CLI_TIMEOUT_S)
    assert code == 0, err
    names = out.decode().split()
    assert "gpt-4o-mini" in names and names == sorted(names)
    code, out, err = await run_relay("models", "--json", env=env, timeout_s=CLI_TIMEOUT_S)
    assert [m["id"] for m in orjson.loads(out)["data"]] == names

    job = await api.submit({"model": "gpt-4o-mini", "requests": slow_requests(1, 1, "j")})
    await api.wait_status(job["id"], {"completed"}, timeout=60)
    listed: Run = await relay(system, api_key, "list", "--json", "--limit", "100")
    page = orjson.loads(listed.out)
    assert job["id"] in [b["id"] for b in page["data"]] and "has_more" in page
    deliveries = await relay(system, api_key, "deliveries", job["id"], "--json")
    assert orjson.loads(deliveries.out) == {
        "object": "list",
        "batch_id": job["id"],
        "status": None,
        "next_attempt_at": None,
        "data": [],
        "has_more": False,
    }
