"""``relay batch …`` as a user runs it: a subprocess talking HTTP to the e2e system."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import orjson

from relay_batches.ids import new_id
from tests.helpers.processes import System
from tests.helpers.support import (
    ApiClient,
    WebhookReceiver,
    past_redelivery_cooldown,
    run_relay,
    wait_until,
)

ID_LINE = re.compile(r"^([0-9a-f]{32})  (queued|scheduled)  (\d+) rows  (.+)$")
CLI_TIMEOUT_S = 90


@dataclass(frozen=True)
class Run:
    """A finished CLI run."""

    code: int
    out: str
    err: str


async def relay(system: System, key: str, *args: str) -> Run:
    """Run ``relay batch ARGS`` against the e2e system with ``key``; wait for it to exit."""
    env = {**os.environ, "RELAY_URL": system.api_url, "RELAY_API_KEY": key}
    code, out, err = await run_relay("batch", *args, env=env, timeout_s=CLI_TIMEOUT_S)
    return Run(code, out.decode(), err.decode())


def created_ids(run: Run) -> list[str]:
    """The job ids ``submit`` printed, one line each."""
    ids = []
    for line in run.out.splitlines():
        match = ID_LINE.match(line)
        assert match, (line, run)
        ids.append(match.group(1))
    return ids


async def test_submit_wait_prints_the_id_and_exits_zero_when_completed(
    system: System, api_key: str, api: ApiClient, tmp_path: Path
) -> None:
    prompts = tmp_path / "prompts.csv"
    prompts.write_text('prompt\nfirst\n"second, with a comma"\nthird\n')
    run = await relay(
        system, api_key, "submit", str(prompts), "--model", "gpt-4o-mini", "--budget", "2", "--wait"
    )
    assert run.code == 0, run
    (batch_id,) = created_ids(run)
    assert (await api.get(batch_id))["budget_usd"] == 2
    assert f"{batch_id} completed: 3 rows, 3 ok, 0 failed" in run.err
    assert "100%  3/3" in run.err
    batch = await api.get(batch_id)
    assert (batch["status"], batch["name"], batch["completed"]) == ("completed", "prompts.csv", 3)
    results = await api.results(batch_id)
    assert [r["content"] for r in results["data"]] == [
        "echo: first",
        "echo: second, with a comma",
        "echo: third",
    ]


async def test_results_o_writes_one_json_line_per_row_in_order(
    system: System, api_key: str, api: ApiClient, tmp_path: Path
) -> None:
    source = tmp_path / "rows.jsonl"
    requests = [
        {"custom_id": f"c-{i}", "messages": [{"role": "user", "content": f"line {i}"}]}
        for i in range(60)
    ]
    source.write_bytes(b"\n".join(orjson.dumps(r) for r in requests) + b"\n")
    submitted = await relay(
        system, api_key, "submit", str(source), "--model", "gpt-4o-mini", "--priority", "3"
    )
    assert submitted.code == 0, submitted
    (batch_id,) = created_ids(submitted)
    watched = await relay(system, api_key, "watch", batch_id, "--interval", "0.3")
    assert watched.code == 0, watched
    assert "ETA" in watched.err and "rows/s" in watched.err

    out = tmp_path / "out.jsonl"
    run = await relay(system, api_key, "results", batch_id, "-o", str(out))
    assert run.code == 0, run
    assert f"wrote 60 rows of {batch_id}" in run.err
    lines = out.read_bytes().splitlines()
    assert [orjson.loads(line) for line in lines] == [
        {"custom_id": f"c-{i}", "content": f"echo: line {i}"} for i in range(60)
    ]
    assert not (tmp_path / "out.jsonl.part").exists()

    status = await relay(system, api_key, "status", batch_id)
    assert status.code == 0, status
    assert re.search(r"^status\s+completed$", status.out, re.M), status.out
    assert re.search(r"^priority\s+3$", status.out, re.M), status.out
    listed = await relay(system, api_key, "list", "--status", "completed", "--limit", "100")
    assert listed.code == 0 and batch_id in listed.out, listed


async def test_a_bad_key_prints_the_api_message_on_one_line(system: System, api_key: str) -> None:
    run = await relay(system, "rk_not_a_real_key", "list")
    assert run.code == 1, run
    assert run.out == ""
    assert run.err == "relay: invalid API key (401 authentication_error)\n"

    run = await relay(system, api_key, "status", "0" * 32)
    assert run.code == 1, run
    assert run.err.count("\n") == 1 and "404 not_found_error" in run.err, run


async def test_an_unknown_model_and_a_bad_line_are_one_readable_line(
    system: System, api_key: str, tmp_path: Path
) -> None:
    good = tmp_path / "good.csv"
    good.write_text("hello\n")
    run = await relay(system, api_key, "submit", str(good), "--model", "no-such-model")
    assert run.code == 1, run
    assert run.err.startswith("relay: model 'no-such-model' is unknown; known models: "), run
    assert "gpt-4o-mini" in run.err
    assert run.err.endswith(" (400 invalid_request_error, param model)\n"), run
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "ok"}]}\n{oops\n')
    run = await relay(system, api_key, "submit", str(good), str(bad), "--model", "gpt-4o-mini")
    assert run.code == 1, run
    assert run.err.startswith("relay: 'bad.jsonl' line 2: not valid JSON"), run
    assert run.err.endswith("(400 invalid_request_error, param file[1])\n"), run


async def test_watch_of_a_canceled_job_exits_non_zero(
    system: System, api_key: str, tmp_path: Path
) -> None:
    slow = tmp_path / "slow.csv"
    slow.write_text("".join(f"[sim:delay-ms=200] slow {i}\n" for i in range(200)))
    submitted = await relay(system, api_key, "submit", str(slow), "--model", "gpt-4o-mini")
    (batch_id,) = created_ids(submitted)
    canceled = await relay(system, api_key, "cancel", batch_id)
    assert (canceled.code, canceled.out) == (0, f"{batch_id}  canceled\n"), canceled
    watched = await relay(system, api_key, "watch", batch_id)
    assert watched.code == 4, watched
    assert f"{batch_id} canceled:" in watched.err
    results = await relay(system, api_key, "cancel", batch_id)
    assert results.code == 1 and "409 conflict_error" in results.err, results


async def test_submit_takes_openai_and_anthropic_files_without_a_model(
    system: System, api_key: str, api: ApiClient, tmp_path: Path
) -> None:
    openai_file = tmp_path / "openai.jsonl"
    lines = [
        {
            "custom_id": f"o-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": f"openai {i}"}],
                "max_tokens": 16,
            },
        }
        for i in range(2)
    ]
    openai_file.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    anthropic_file = tmp_path / "anthropic.jsonl"
    params = {
        "model": "gpt-4o-mini",
        "max_tokens": 16,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "anthropic 0"}],
    }
    anthropic_file.write_bytes(orjson.dumps({"custom_id": "a_0", "params": params}) + b"\n")
    run = await relay(system, api_key, "submit", str(openai_file), str(anthropic_file), "--wait")
    assert run.code == 0, run
    openai_id, anthropic_id = created_ids(run)
    assert (await api.get(openai_id))["model"] == "gpt-4o-mini"
    openai_results = await api.results(openai_id)
    assert [(r["custom_id"], r["content"]) for r in openai_results["data"]] == [
        ("o-0", "echo: openai 0"),
        ("o-1", "echo: openai 1"),
    ]
    anthropic_results = await api.results(anthropic_id)
    assert [(r["custom_id"], r["content"]) for r in anthropic_results["data"]] == [
        ("a_0", "echo: anthropic 0")
    ]


# --- operating a running batch (issue 14) -----------------------------------------------

DELIVERY_LINE = re.compile(
    r"^\s*(\d+)  (\w+)\s+(\d{3}|-)\s+(\d+ ms|-)  (\S+Z)  (first|retry|redelivery)\s+(.+)$"
)


def slow_requests(n: int, delay_ms: int, tag: str) -> list[dict[str, object]]:
    """``n`` rows the simulator answers after ``delay_ms``."""
    return [
        {
            "custom_id": f"{tag}-{i}",
            "messages": [{"role": "user", "content": f"[sim:delay-ms={delay_ms}] {tag} {i}"}],
        }
        for i in range(n)
    ]


async def test_retry_makes_a_job_of_the_failed_rows_and_refuses_a_running_job(
    system: System, api_key: str, api: ApiClient
) -> None:
    flaky = f"[sim:fail-first=4] cli {new_id()}"  # dead-lettered, then answers
    requests = [
        {"custom_id": "ok", "messages": [{"role": "user", "content": "ok"}]},
        {"custom_id": "flaky", "messages": [{"role": "user", "content": flaky}]},
        {"custom_id": "bad", "messages": [{"role": "user", "content": "x [sim:status=400]"}]},
    ]
    job = await api.submit({"model": "gpt-4o-mini", "name": "cli-retry", "requests": requests})
    ended = await api.wait_status(job["id"], {"completed"}, timeout=60)
    assert (ended["failed"], ended["dead_letter"]) == (2, 1)

    run = await relay(system, api_key, "retry", job["id"], "--rows", "dead_letter", "--wait")
    assert run.code == 0, run
    (dead_id,) = created_ids(run)
    assert run.out == f"{dead_id}  queued  1 rows  cli-retry\n"
    assert f"{dead_id} completed: 1 rows, 1 ok, 0 failed" in run.err
    assert (await api.results(dead_id))["data"] == [
        {"custom_id": "flaky", "content": f"echo: {flaky}"}
    ]

    run = await relay(system, api_key, "retry", job["id"])  # --rows failed: both errors
    assert run.code == 0, run
    (failed_id,) = created_ids(run)
    retry = await api.get(failed_id)
    assert (retry["retry_of"], retry["total"]) == (job["id"], 2)
    assert (await api.get(job["id"]))["retries"] == [dead_id, failed_id]
    status = await relay(system, api_key, "status", job["id"])
    assert re.search(rf"^retries\s+{dead_id} {failed_id}$", status.out, re.M), status.out

    slow = await api.submit({"model": "gpt-4o-mini", "requests": slow_requests(100, 200, "r")})
    run = await relay(system, api_key, "retry", slow["id"])
    assert run.code == 1 and "409 conflict_error" in run.err, run
    assert run.err.count("\n") == 1, run
    run = await relay(system, api_key, "retry", slow["id"], "--rows", "all")
    assert run.code == 2 and "invalid choice: 'all'" in run.err, run
    await relay(system, api_key, "cancel", slow["id"])


async def test_pause_then_resume_and_watch_to_the_end_with_its_cost(
    system: System, api_key: str, api: ApiClient
) -> None:
    # More rows than the e2e dispatch window (256): a paused job keeps the rest back.
    job = await api.submit({"model": "gpt-4o-mini", "requests": slow_requests(600, 50, "p")})
    paused = await relay(system, api_key, "pause", job["id"])
    assert (paused.code, paused.out) == (0, f"{job['id']}  paused\n"), paused
    assert (await api.get(job["id"]))["status"] == "paused"
    again = await relay(system, api_key, "pause", job["id"])
    assert again.code == 1 and "409 conflict_error" in again.err, again
    status = await relay(system, api_key, "status", job["id"])
    assert re.search(r"^status\s+paused$", status.out, re.M), status.out
    assert re.search(r"^cost\s+\$\d+\.\d+$", status.out, re.M), status.out

    resumed = await relay(system, api_key, "resume", job["id"])
    assert (resumed.code, resumed.out) == (0, f"{job['id']}  queued\n"), resumed
    watched = await relay(system, api_key, "watch", job["id"], "--interval", "0.3")
    assert watched.code == 0, watched
    assert re.search(r"ETA \S+  cost \$\d+\.\d+  \w+$", watched.err, re.M), watched.err
    assert re.search(r"600 ok, 0 failed, 0 dead letter in \S+, cost \$\d+\.\d+$", watched.err, re.M)
    ended = await api.get(job["id"])
    assert (ended["status"], ended["completed"]) == ("completed", 600)
    again = await relay(system, api_key, "resume", job["id"])
    assert again.code == 1 and "409 conflict_error" in again.err, again


async def test_deliveries_lists_every_attempt_and_redeliver_posts_the_summary_again(
    system: System, api_key: str, api: ApiClient, webhooks: WebhookReceiver
) -> None:
    job = await api.submit(
        {"model": "gpt-4o-mini", "requests": slow_requests(3, 10, "d"), "webhookUrl": webhooks.url}
    )
    await api.wait_status(job["id"], {"completed"}, timeout=60)

    async def attempts(count: int) -> Run | None:
        run = await relay(system, api_key, "deliveries", job["id"])
        assert run.code == 0, run
        lines = [DELIVERY_LINE.match(line) for line in run.out.splitlines()]
        assert all(lines), run
        settled = run.err == f"{job['id']}: delivery delivered\n"
        return run if len(lines) == count and settled else None

    first = await wait_until(lambda: attempts(1), 30, "the first delivery")
    match = DELIVERY_LINE.match(first.out)
    assert match and match.group(2, 3, 6, 7) == ("delivered", "204", "first", "-"), first

    await past_redelivery_cooldown(system.iso.database_url, job["id"])
    run = await relay(system, api_key, "redeliver", job["id"])
    assert run.code == 0, run
    assert re.fullmatch(rf"{job['id']}  retrying  next attempt \S+Z\n", run.out), run
    second = await wait_until(lambda: attempts(2), 30, "the redelivery")
    match = DELIVERY_LINE.match(second.out.splitlines()[1])
    assert match and match.group(1, 2, 6) == ("2", "delivered", "redelivery"), second
    assert len(webhooks.for_batch(job["id"])) == 2

    slow = slow_requests(100, 200, "q")
    running = await api.submit(
        {"model": "gpt-4o-mini", "requests": slow, "webhookUrl": webhooks.url}
    )
    refused = await relay(system, api_key, "redeliver", running["id"])
    assert refused.code == 1 and "409 conflict_error" in refused.err, refused
    await relay(system, api_key, "cancel", running["id"])


async def test_delete_removes_an_ended_job_and_a_template_and_refuses_a_running_job(
    system: System, api_key: str, api: ApiClient
) -> None:
    job = await api.submit({"model": "gpt-4o-mini", "requests": [{"messages": _user("bye")}]})
    await api.wait_status(job["id"], {"completed"}, timeout=60)

    run = await relay(system, api_key, "delete", job["id"])
    assert (run.code, run.out) == (0, f"{job['id']}  deleted\n"), run
    for path in ("", "/results", "/stats"):
        status, body = await api.request("GET", f"/v1/batches/{job['id']}{path}")
        assert (status, body["error"]["type"]) == (404, "not_found_error"), (path, body)
    again = await relay(system, api_key, "delete", job["id"])
    assert again.code == 1 and "404 not_found_error" in again.err, again

    slow = await api.submit({"model": "gpt-4o-mini", "requests": slow_requests(50, 200, "d")})
    await api.wait_status(slow["id"], {"running"}, timeout=30)
    refused = await relay(system, api_key, "delete", slow["id"])
    assert refused.code == 1 and "409 conflict_error" in refused.err, refused
    assert "running" in refused.err and refused.err.count("\n") == 1, refused
    await relay(system, api_key, "cancel", slow["id"])
    canceled = await api.wait_status(slow["id"], {"canceled"}, timeout=30)
    run = await relay(system, api_key, "delete", canceled["id"])
    assert run.code == 0, run

    template = await api.submit(
        {"model": "gpt-4o-mini", "cron": "0 9 * * 1", "requests": [{"messages": _user("t")}]}
    )
    run = await relay(system, api_key, "delete", template["id"])
    assert (run.code, run.out) == (0, f"{template['id']}  deleted\n"), run
    status, _ = await api.request("GET", f"/v1/batches/{template['id']}")
    assert status == 404


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]
