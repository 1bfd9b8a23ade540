"""``make ha-check``: Relay on a three-node RabbitMQ cluster and a Postgres primary with a
hot standby, losing a broker node twice and the primary once in the middle of a batch.

It starts the cluster (:mod:`tests.ha.brokers`, ``RELAY_QUEUE_TYPE=quorum``, the classic
queues mirrored) and the pair (:mod:`tests.ha.databases`), runs every service twice (two
row-workers, two of each other service) given every node's address and both database
hosts, and submits a 10,000-row job and a 1,000-row job (both with a webhook) and a cron
template firing every minute (its runs with a webhook). Then, each once the jobs moved on
(:mod:`tests.ha.faults`): ``kill -9`` of the node holding ``<ns>.rows``, started again;
``kill -9`` of the node leading the big job's results shard, started again; the primary
stopped and the standby promoted. Once the jobs end and the template is canceled it
checks every job (:func:`~tests.helpers.checks.assert_exactly_once`: nothing lost,
nothing counted twice, one webhook per job and per run), one run per cron tick, and what
the simulator was paid: each row's request answered exactly once (a run's rows once per
run). It prints the recovery times and writes ``test-output/ha/report.json``; servers
stopped and data folders removed however it ended.

``RELAY_HA_ROWS`` and ``RELAY_HA_LATENCY_MS`` override the big job's size and the
simulator's latency.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson

from relay_batches.bus.topology import Names, results_shard
from relay_batches.ids import new_id
from relay_batches.services.relay_cli import admin
from tests.chaos.paid import paid_check
from tests.chaos.settings import CHAOS_ENV
from tests.ha.brokers import RabbitCluster
from tests.ha.databases import PgPair
from tests.ha.faults import FaultRecord, fail_over, kill_node, node_back, strike
from tests.helpers.checks import Verdict, assert_exactly_once, wait_terminal
from tests.helpers.processes import SERVICES, System, build_system, signed_in, sim_answers
from tests.helpers.support import ApiClient, Isolation, WebhookReceiver, free_port, rows, wait_until

OUTPUT = Path("test-output/ha")
BIG_ROWS = int(os.environ.get("RELAY_HA_ROWS", "10000"))
HOOK_ROWS = 1000
CRON_ROWS = 20
LATENCY_MS = int(os.environ.get("RELAY_HA_LATENCY_MS", "100"))
SHARDS = 4  # RELAY_RESULTS_SHARDS' default
FIRST_FAULT_AT = 600  # rows done before the first fault
STEP = 400  # rows done between faults
# What docs/operations/high-availability.md asks of a cluster's services.
CLUSTER_ENV = {"RELAY_QUEUE_TYPE": "quorum", "RELAY_REDELIVERY_WAIT_S": "10"}
CRON_GRACE_S = 20  # a tick this close to the cancel may not have spawned its run yet


def ha_system(iso: Isolation, log_dir: Path, amqp_url: str) -> System:
    """Every service twice (the ingest-api's second on a port of its own) and the
    simulator, on the cluster and the pair."""
    system = build_system(
        iso,
        log_dir,
        workers=2,
        sim_env={"RELAY_SIM_LATENCY_MS": str(LATENCY_MS)},
        **(CHAOS_ENV | CLUSTER_ENV | {"RELAY_AMQP_URL": amqp_url}),
    )
    for name in SERVICES:
        if name == "row-worker":
            continue
        extra = {"RELAY_API_PORT": str(free_port())} if name == "ingest-api" else {}
        system.add(f"{name}#2", **extra)
    return system


async def submit_all(api: ApiClient, webhooks: WebhookReceiver) -> dict[str, Any]:
    """The 10,000-row job, the webhook job and the cron template."""
    big = await api.submit(
        {"model": "gpt-4o-mini", "requests": rows(BIG_ROWS, "big {i}"), "webhookUrl": webhooks.url}
    )
    hook = await api.submit(
        {
            "model": "gpt-4o-mini",
            "requests": rows(HOOK_ROWS, "hook {i}"),
            "webhookUrl": webhooks.url,
        }
    )
    template = await api.submit(
        {
            "model": "gpt-4o-mini",
            "cron": "* * * * *",
            "requests": rows(CRON_ROWS, "cron {i}"),
            "webhookUrl": webhooks.url,
        }
    )
    return {"big": big, "hook": hook, "template": template}


async def cron_runs(url: str, template_id: str) -> tuple[datetime, list[tuple[str, datetime]]]:
    """The template's creation time and its runs (id, tick), by the database's clock."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        created = await conn.fetchval("SELECT created_at FROM batches WHERE id = $1", template_id)
        runs = await conn.fetch(
            "SELECT id, tick FROM batches WHERE template_id = $1 ORDER BY tick", template_id
        )
    finally:
        await conn.close()
    return created, [(r["id"], r["tick"]) for r in runs]


async def database_now(url: str) -> datetime:
    """The database's clock."""
    conn = await asyncpg.connect(url, timeout=10)
    try:
        now: datetime = await conn.fetchval("SELECT now()")
    finally:
        await conn.close()
    return now


def expected_ticks(created: datetime, canceled: datetime) -> list[datetime]:
    """The minute ticks after ``created`` up to :data:`CRON_GRACE_S` before ``canceled``."""
    tick = created.replace(second=0, microsecond=0) + timedelta(minutes=1)
    ticks = []
    while tick <= canceled - timedelta(seconds=CRON_GRACE_S):
        ticks.append(tick)
        tick += timedelta(minutes=1)
    return ticks


async def run_check(base: Path, http: aiohttp.ClientSession, report: dict[str, Any]) -> None:
    """Everything between starting the servers and checking (module doc)."""
    tag = new_id()[:6].lower()
    cluster = RabbitCluster(base, [(free_port(), free_port()) for _ in range(3)], tag)
    pair = PgPair(base, (free_port(), free_port()))
    report["servers"] = {"nodes": [n.name for n in cluster.nodes], "postgres": list(pair.ports)}
    started = time.monotonic()
    try:
        await asyncio.gather(asyncio.to_thread(cluster.start), asyncio.to_thread(pair.start))
        await wait_until(lambda: asyncio.to_thread(pair.streaming), 60, "the standby streaming")
        report["servers_start_s"] = round(time.monotonic() - started, 1)
        namespace = f"ha{tag}"
        database_url = pair.database_url("relay_ha")
        await admin.migrate(database_url)
        iso = Isolation(database_url, "relay_ha", namespace)
        await asyncio.to_thread(cluster.set_mirroring, namespace)
        system = ha_system(iso, OUTPUT / "logs", cluster.amqp_url)
        for old in (OUTPUT / "logs").glob("*.log"):
            old.unlink()
        try:
            await system.start_all(http)
            async with WebhookReceiver() as webhooks:
                await faults_and_checks(system, cluster, pair, http, webhooks, report)
        finally:
            report["exit_codes"] = await asyncio.to_thread(system.stop_all)
    finally:
        await asyncio.to_thread(cluster.stop)
        await asyncio.to_thread(pair.stop)


async def faults_and_checks(
    system: System,
    cluster: RabbitCluster,
    pair: PgPair,
    http: aiohttp.ClientSession,
    webhooks: WebhookReceiver,
    report: dict[str, Any],
) -> None:
    """Submit, strike the three faults, wait for the end, check (module doc)."""
    api = await signed_in(system, http, "ha")
    jobs = await submit_all(api, webhooks)
    ids = [jobs["big"]["id"], jobs["hook"]["id"]]
    names = Names(system.iso.namespace)
    started = time.monotonic()
    faults: list[FaultRecord] = []

    rows_node = await asyncio.to_thread(cluster.home_of, names.rows)
    record = await strike("kill -9 rows node", rows_node.name, kill_node(cluster, rows_node),
                          system, http, ids, FIRST_FAULT_AT)  # fmt: skip
    await node_back(record, cluster, rows_node, [names.rows, names.dispatch])
    faults.append(record)
    report["faults"] = [asdict(f) for f in faults]

    shard = names.results_shard(results_shard(ids[0], SHARDS))
    leader = await asyncio.to_thread(cluster.leader_of, shard)
    record = await strike(f"kill -9 leader of {shard}", leader.name, kill_node(cluster, leader),
                          system, http, ids, record.rows_done + STEP)  # fmt: skip
    await node_back(record, cluster, leader, [names.rows, names.dispatch])
    faults.append(record)
    report["faults"] = [asdict(f) for f in faults]

    record = await strike("postgres failover", f"standby :{pair.ports[1]} promoted",
                          fail_over(pair), system, http, ids, record.rows_done + STEP)  # fmt: skip
    faults.append(record)
    report["faults"] = [asdict(f) for f in faults]

    for batch_id in ids:
        await wait_terminal(api, batch_id, 900)
    report["jobs_s"] = round(time.monotonic() - started, 1)
    await end_cron(api, system, jobs["template"]["id"], report)
    verdicts = {
        "big": await assert_exactly_once(api, system.iso.database_url, ids[0],
                                         [f"r-{i}" for i in range(BIG_ROWS)], webhooks),
        "hook": await assert_exactly_once(api, system.iso.database_url, ids[1],
                                          [f"r-{i}" for i in range(HOOK_ROWS)], webhooks),
    }  # fmt: skip
    for run_id in report["cron"]["run_ids"]:
        verdicts[run_id] = await assert_exactly_once(
            api, system.iso.database_url, run_id, [f"r-{i}" for i in range(CRON_ROWS)], webhooks
        )
    report["verdicts"] = {k: asdict(v) for k, v in verdicts.items()}
    check_paid(await sim_answers(http, system), verdicts, len(report["cron"]["run_ids"]), report)


async def end_cron(
    api: ApiClient, system: System, template_id: str, report: dict[str, Any]
) -> None:
    """Cancel the template once a tick passed after the faults, wait for its runs; one
    run per tick, each tick's run there."""
    url = system.iso.database_url
    now = await database_now(url)
    next_tick = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
    await asyncio.sleep((next_tick - now).total_seconds() + CRON_GRACE_S)
    status, body = await api.request("POST", f"/v1/batches/{template_id}/cancel")
    assert status == 200, (status, body)
    canceled = await database_now(url)
    created, runs = await cron_runs(url, template_id)
    for run_id, _ in runs:
        await wait_terminal(api, run_id, 300)
    ticks = [tick for _, tick in runs]
    wanted = expected_ticks(created, canceled)
    report["cron"] = {"run_ids": [r for r, _ in runs], "ticks": [t.isoformat() for t in ticks],
                      "expected": [t.isoformat() for t in wanted]}  # fmt: skip
    assert len(ticks) == len(set(ticks)), f"two runs of one tick: {ticks}"
    assert set(wanted) <= set(ticks), f"ticks without a run: {sorted(set(wanted) - set(ticks))}"
    assert all(created < t <= canceled for t in ticks), (
        f"a run outside the template's life: {ticks}"
    )


def check_paid(
    paid: dict[str, Any], verdicts: dict[str, Verdict], runs: int, report: dict[str, Any]
) -> None:
    """Every row's request answered once (a cron row once per run): no row lost on the
    way, none paid twice."""
    report["paid"] = paid
    rows_done_total = sum(v.completed + v.failed for v in verdicts.values())
    check = asdict(paid_check(paid, []))
    report["paid_check"] = check
    cron_repeats = CRON_ROWS * max(runs - 1, 0)
    report["paid_twice"] = int(paid["extra_answers"]) - cron_repeats
    assert int(paid["answers"]) == rows_done_total, (
        f"the simulator answered {paid['answers']} calls for {rows_done_total} rows"
    )
    assert report["paid_twice"] == 0, f"{report['paid_twice']} rows paid twice: {check}"
    assert int(paid["most_answers"]) <= max(runs, 1), check


HEADER = f"{'fault':<40}{'target':<32}{'rows':>5}  ready_s  resumed_s  node_back_s"


def print_table(report: dict[str, Any]) -> None:
    """The recovery table and the invariants, as ``make ha-check`` prints them."""
    print("\n" + HEADER)
    for f in report.get("faults", []):
        back = "" if f["back_s"] is None else f"{f['back_s']:.1f}"
        print(f"{f['fault']:<40}{f['target']:<32}{f['rows_done']:>5}  {f['ready_s']:>7.1f}"
              f"  {f['resumed_s']:>9.1f}  {back:>11}")  # fmt: skip
    verdicts = report.get("verdicts", {}).values()
    lost = sum(max(v["total"] - v["result_rows"], 0) for v in verdicts)
    counted_twice = sum(max(v["completed"] + v["failed"] - v["total"], 0) for v in verdicts)
    runs = len(report.get("cron", {}).get("run_ids", []))
    print(f"\njobs checked {len(verdicts)} (cron runs {runs}, one per tick), rows lost {lost},"
          f" counted twice {counted_twice}, paid twice {report.get('paid_twice')},"
          f" webhooks {sum(v['webhooks'] for v in verdicts)} for {len(verdicts)} jobs;"
          f" servers {report.get('servers_start_s')} s to start, jobs {report.get('jobs_s')} s,"
          f" whole check {report.get('elapsed_s')} s")  # fmt: skip


def write_report(report: dict[str, Any]) -> None:
    """Write ``report.json`` and print the table."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    body = orjson.dumps(report, option=orjson.OPT_INDENT_2, default=str)
    (OUTPUT / "report.json").write_bytes(body)
    print_table(report)
    print(f"report: {OUTPUT / 'report.json'}; ok: {report['ok']}")
    if "error" in report:
        print(f"failed: {report['error']}")


async def main() -> int:
    """Run the check in a temporary folder, removed afterwards; 0 if every invariant held."""
    base = Path(tempfile.mkdtemp(prefix="relay-ha-"))
    report: dict[str, Any] = {"rows": BIG_ROWS, "latency_ms": LATENCY_MS, "ok": False}
    started = time.monotonic()
    try:
        async with aiohttp.ClientSession() as http:
            await run_check(base, http, report)
        codes = report["exit_codes"]
        assert all(code == 0 for code in codes.values()), f"unclean exits: {codes}"
        report["ok"] = True
    except BaseException as exc:
        report["error"] = repr(exc)
        raise
    finally:
        report["elapsed_s"] = round(time.monotonic() - started, 1)
        await asyncio.to_thread(shutil.rmtree, base, True)
        write_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
