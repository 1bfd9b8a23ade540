"""Chaos with two workspaces at once (part of ``make test``): on a system of two running
slots, workspace A queues ten 300-row jobs and workspace B then three 20-row jobs;
meanwhile the dispatcher, the aggregator, the notifier and the row-workers are killed
with ``kill -9``. Every job of both is exactly once, B finished while most of A's queue
was unfinished, one webhook per job, and every service exits 0 on the final SIGTERM."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from relay_batches.services.relay_cli import admin
from tests.chaos.driver import (
    ChaosReport,
    ChaosSettings,
    assert_killed_and_clean,
    chaos_system,
    kill_plan,
    run_kills,
)
from tests.helpers.checks import assert_exactly_once, wait_terminal
from tests.helpers.fairness import assert_served_fairly, finish_order, job_times
from tests.helpers.processes import System
from tests.helpers.support import (
    ApiClient,
    WebhookReceiver,
    create_isolation,
    drop_isolation,
    rows,
)

A_JOBS, A_ROWS = 10, 300
B_JOBS, B_ROWS = 3, 20
KILLED = ("dispatcher", "aggregator", "notifier")


def batch(n: int, webhooks: WebhookReceiver) -> dict[str, Any]:
    """A batch of ``n`` rows that reports to ``webhooks``."""
    return {"model": "gpt-4o-mini", "requests": rows(n), "webhookUrl": webhooks.url}


async def client(system: System, http: aiohttp.ClientSession, workspace: str) -> ApiClient:
    """A client signed in to ``workspace`` (created on first use)."""
    created = await admin.create_key(system.iso.database_url, workspace)
    return ApiClient(system.api_url, created.key, http)


async def check_jobs(
    system: System, jobs: dict[str, tuple[ApiClient, str, int]], webhooks: WebhookReceiver
) -> dict[str, Any]:
    """Exactly once for every job (label: client, id, rows), in the ledger, the results
    and one webhook each; the facts found, by label."""
    verdicts = {}
    for label, (api, batch_id, n) in jobs.items():
        await wait_terminal(api, batch_id, 120)
        verdict = await assert_exactly_once(
            api,
            system.iso.database_url,
            batch_id,
            [f"r-{i}" for i in range(n)],
            webhooks,
            [f"echo: row {i}" for i in range(n)],
        )
        verdicts[label] = asdict(verdict)
    return verdicts


async def check_fairness(
    system: System, jobs: dict[str, tuple[ApiClient, str, int]]
) -> dict[str, Any]:
    """B's jobs finished while most of A's were unfinished; the finish order and times."""
    label_of = {batch_id: label for label, (_, batch_id, _) in jobs.items()}
    times = await job_times(system.iso.database_url, list(label_of))
    finished = {label_of[i]: t.completed_at for i, t in times.items()}
    small = [label for label in jobs if label.startswith("B")]
    large = [label for label in jobs if label.startswith("A")]
    waiting = assert_served_fairly(finished, small, large)
    first = min(t.created_at for t in times.values())
    order = finish_order(finished)
    return {
        "a_unfinished_when_b_done": waiting,
        "finish_order": order,
        "finished_s": {
            label: round((at - first).total_seconds(), 2)
            for label in order
            if (at := finished[label]) is not None
        },
    }


def check_webhooks(webhooks: WebhookReceiver, jobs: int) -> dict[str, int]:
    """One webhook per job and no ``webhook-id`` twice; the counts."""
    ids = [{k.lower(): v for k, v in h.items()}["webhook-id"] for h in webhooks.headers]
    twice = [i for i, n in Counter(ids).items() if n > 1]
    assert not twice, f"webhook-ids delivered twice: {twice}"
    assert len(webhooks.bodies) == jobs, f"{len(webhooks.bodies)} webhooks for {jobs} jobs"
    return {"webhooks": len(ids), "unique_webhook_ids": len(set(ids))}


async def run_round(
    system: System,
    http: aiohttp.ClientSession,
    webhooks: WebhookReceiver,
    settings: ChaosSettings,
    report: ChaosReport,
) -> None:
    """Submit A's queue then B's jobs, kill by the plan, check everything into ``report``."""
    api_a = await client(system, http, "chaos-a")
    api_b = await client(system, http, "chaos-b")
    started = time.monotonic()
    jobs = {}
    for n in range(A_JOBS):
        jobs[f"A{n}"] = (api_a, (await api_a.submit(batch(A_ROWS, webhooks)))["id"], A_ROWS)
    for n in range(B_JOBS):
        jobs[f"B{n}"] = (api_b, (await api_b.submit(batch(B_ROWS, webhooks)))["id"], B_ROWS)
    rng = random.Random(settings.seed)
    plan = kill_plan(system, rng, settings.extra_worker_kills, KILLED)
    ids = [batch_id for _, batch_id, _ in jobs.values()]
    await run_kills(system, http, ids, plan, rng, settings, report)
    verdicts = await check_jobs(system, jobs, webhooks)
    report.elapsed_s = round(time.monotonic() - started, 1)
    report.verdict = {
        "jobs": {"A": A_JOBS, "B": B_JOBS},
        "rows": {
            "A": sum(v["completed"] for k, v in verdicts.items() if k.startswith("A")),
            "B": sum(v["completed"] for k, v in verdicts.items() if k.startswith("B")),
        },
        **await check_fairness(system, jobs),
        **check_webhooks(webhooks, len(jobs)),
        "per_job": verdicts,
    }


@pytest.mark.timeout(300)
async def test_two_workspaces_under_kill_9_are_served_fairly_and_exactly_once(
    output_dir: Path, http: aiohttp.ClientSession, webhooks: WebhookReceiver
) -> None:
    settings = ChaosSettings.from_env(rows=0, latency_ms=40, extra_worker_kills=1)
    report = ChaosReport(
        "two-workspaces", settings.seed, A_JOBS * A_ROWS + B_JOBS * B_ROWS, settings.latency_ms
    )
    iso = await create_isolation("chaosws")
    log_dir = output_dir / "chaos-two-workspaces"
    system = chaos_system(iso, log_dir, settings, RELAY_MAX_RUNNING_JOBS="2")
    try:
        await system.start_all(http)
        await run_round(system, http, webhooks, settings, report)
    finally:
        codes = await asyncio.to_thread(system.stop_all)
        await drop_isolation(iso)
    report.exit_codes = codes
    report.write(output_dir / "chaos")

    assert_killed_and_clean(report, {*KILLED, "row-worker"}, settings)
    assert len(webhooks.bodies) == A_JOBS + B_JOBS, "a webhook arrived after the check"
