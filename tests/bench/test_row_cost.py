"""What one row costs end to end (``make bench``; the figures behind docs/operations/capacity.md).

One job of ``RELAY_BENCH_COST_ROWS`` rows (default 100,000) runs through the whole system
(every service an OS process, the simulator answering at once), and the run's deltas are
divided by the rows:

- bus: messages and message-body bytes published per row, by kind, summed over every
  service's ``/metrics`` (``relay_messages_published_total``,
  ``relay_message_bytes_published_total``);
- Postgres, for the bench's own database (``pg_stat_database``): transactions,
  tuples inserted, updated and deleted per row; statements per row only when
  ``pg_stat_statements`` is already in ``shared_preload_libraries`` (the bench never
  restarts Postgres); table plus index bytes per row (``pg_total_relation_size``);
- WAL bytes per row (``pg_current_wal_lsn`` and ``pg_stat_wal``): server-wide, so any
  other database busy meanwhile inflates it; ``cost_other_db_xacts`` says how busy the
  rest of the server was (0 for a clean figure);
- CPU seconds per row of each service process (and the simulator's), the machine's busy
  share, rows/s and each service's peak RSS (``/proc``); and of the whole servers:
  ``postgres(server)`` is the postmaster's process tree (every backend, short-lived ones
  included, and the background processes: walwriter, checkpointer, autovacuum, …),
  ``rabbitmq(server)`` the ``beam.smp`` VM's with its children (see :func:`tree_cpu_s`).
  Both are server-wide: work for other databases or vhosts meanwhile inflates them
  (``cost_other_db_xacts`` tells for Postgres).

The background (reconcile loops, heartbeats) is measured on the idle system first and
subtracted from the transaction and WAL figures (the raw figures are reported as well).
Postgres publishes a backend's counters up to ~10 s after its last transaction, hence
the settle before each reading.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.bench.harness import (
    Bench,
    bench_system,
    busy_share,
    machine_ticks,
    postmaster_pid,
    process_cpu_s,
    rabbitmq_pid,
    rss_mib,
    tree_cpu_s,
)
from tests.helpers.support import PG_ADMIN_URL, rows

COST_ROWS = int(os.environ.get("RELAY_BENCH_COST_ROWS", "100000"))
CONCURRENCY = 32
STATS_SETTLE_S = 11.0  # PGSTAT_IDLE_INTERVAL (10 s) plus a margin
IDLE_S = 15.0
COUNTERS = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted")


async def _published(http: aiohttp.ClientSession, bench: Bench) -> dict[str, float]:
    """``{"messages:<kind>": n, "bytes:<kind>": n}`` summed over every service."""
    totals: dict[str, float] = defaultdict(float)
    for name, proc in bench.system.processes.items():
        port = proc.health_port()
        if name == "upstream-sim" or port is None:
            continue
        async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "relay_messages_published_total":
                    totals[f"messages:{sample.labels['kind']}"] += sample.value
                elif sample.name == "relay_message_bytes_published_total":
                    totals[f"bytes:{sample.labels['kind']}"] += sample.value
    return totals


async def _pg_counters(admin: asyncpg.Connection, database: str) -> dict[str, float]:
    """This database's counters, the rest of the server's commits, WAL position and stats."""
    mine = await admin.fetchrow(
        f"SELECT {', '.join(COUNTERS)} FROM pg_stat_database WHERE datname = $1", database
    )
    assert mine is not None
    others = await admin.fetchval(
        "SELECT coalesce(sum(xact_commit + xact_rollback), 0) FROM pg_stat_database"
        " WHERE datname IS NOT NULL AND datname <> $1",
        database,
    )
    wal = await admin.fetchrow(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') AS lsn, wal_records, wal_fpi,"
        " wal_bytes FROM pg_stat_wal"
    )
    assert wal is not None
    return {
        **{k: float(mine[k]) for k in COUNTERS},
        "other_db_xacts": float(others),
        "wal_lsn_bytes": float(wal["lsn"]),
        "wal_records": float(wal["wal_records"]),
        "wal_fpi": float(wal["wal_fpi"]),
        "wal_bytes": float(wal["wal_bytes"]),
    }


async def _statements(admin: asyncpg.Connection, database: str) -> float | None:
    """Statements run in ``database`` so far, if ``pg_stat_statements`` is loaded."""
    loaded = await admin.fetchval("SHOW shared_preload_libraries")
    if "pg_stat_statements" not in str(loaded):
        return None
    await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return float(
        await admin.fetchval(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s"
            " JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = $1",
            database,
        )
    )


async def _table_bytes(database_url: str) -> dict[str, int]:
    """Table plus index plus TOAST bytes of every table of the bench database."""
    conn = await asyncpg.connect(database_url)
    try:
        found = await conn.fetch(
            "SELECT relname, pg_total_relation_size(relid) AS size FROM pg_stat_user_tables"
        )
        total = await conn.fetchval("SELECT pg_database_size(current_database())")
    finally:
        await conn.close()
    sizes = {str(r["relname"]): int(r["size"]) for r in found}
    sizes["(database)"] = int(total)
    return sizes


def _per_row(value: float, n: int, digits: int = 4) -> float:
    return round(value / n, digits)


async def test_what_one_row_costs(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    n = COST_ROWS
    body = orjson.dumps({"model": "gpt-4o-mini", "requests": rows(n, "review {i}: fine")})
    limits = {
        "RELAY_MAX_ROWS": str(max(n, 100_000)),
        "RELAY_MAX_BODY_BYTES": str(max(len(body) * 2, 100 * 1024 * 1024)),
    }
    async with bench_system(output_dir, "cost", http, concurrency=CONCURRENCY, **limits) as bench:
        await bench.run_batch(200)  # warm-up: connections, caches, prepared statements
        database = bench.system.iso.database
        admin = await asyncpg.connect(PG_ADMIN_URL)
        try:
            await asyncio.sleep(STATS_SETTLE_S)
            idle0 = await _pg_counters(admin, database)
            await asyncio.sleep(IDLE_S)
            idle1 = await _pg_counters(admin, database)
            background = {k: (idle1[k] - idle0[k]) / IDLE_S for k in idle0}

            sizes0 = await _table_bytes(bench.database_url)
            pids = {**bench.pids(), "upstream-sim": bench.system.processes["upstream-sim"].pid}
            beam, postmaster = rabbitmq_pid(), await postmaster_pid(admin)
            pg0 = tree_cpu_s(postmaster) if postmaster else 0.0
            bus0, stmts0 = await _published(http, bench), await _statements(admin, database)
            cpu0 = {name: process_cpu_s(pid) for name, pid in pids.items()}
            beam0 = tree_cpu_s(beam) if beam else 0.0
            before, ticks0 = await _pg_counters(admin, database), machine_ticks()
            started = time.perf_counter()
            created = await bench.post(body)
            ingest_s = time.perf_counter() - started
            await bench.wait_completed(created["id"], n)
            seconds = time.perf_counter() - started
            ticks1 = machine_ticks()
            cpu1 = {name: process_cpu_s(pid) for name, pid in pids.items()}
            beam1 = tree_cpu_s(beam) if beam else 0.0
            pg1 = tree_cpu_s(postmaster) if postmaster else 0.0
            peaks = {name: round(rss_mib(pid, "VmHWM"), 1) for name, pid in pids.items()}
            await asyncio.sleep(STATS_SETTLE_S)
            after, bus1 = await _pg_counters(admin, database), await _published(http, bench)
            stmts1 = await _statements(admin, database)
            elapsed = time.perf_counter() - started
        finally:
            await admin.close()
        sizes = await _table_bytes(bench.database_url)

    moved = {k: after[k] - before[k] for k in before}
    net = {k: moved[k] - background[k] * elapsed for k in moved}
    report["cost_rows"] = n
    report["cost_date"] = time.strftime("%Y-%m-%d")
    report["cost_cpus"] = os.cpu_count()
    report["cost_rows_per_s"] = round(n / seconds, 1)
    report["cost_ingest_rows_per_s"] = round(n / ingest_s, 1)
    report["cost_machine_busy_share"] = round(busy_share(ticks0, ticks1), 3)
    kinds = sorted({key.split(":", 1)[1] for key in bus1})
    report["cost_messages_per_row"] = {
        k: _per_row(bus1.get(f"messages:{k}", 0) - bus0.get(f"messages:{k}", 0), n) for k in kinds
    }
    report["cost_bus_bytes_per_row"] = {
        k: _per_row(bus1.get(f"bytes:{k}", 0) - bus0.get(f"bytes:{k}", 0), n, 1) for k in kinds
    }
    report["cost_messages_per_row_total"] = round(sum(report["cost_messages_per_row"].values()), 4)
    report["cost_bus_bytes_per_row_total"] = round(
        sum(report["cost_bus_bytes_per_row"].values()), 1
    )
    xacts = ("xact_commit", "xact_rollback")
    report["cost_pg_xacts_per_row"] = _per_row(sum(net[k] for k in xacts), n)
    report["cost_pg_xacts_per_row_raw"] = _per_row(sum(moved[k] for k in xacts), n)
    report["cost_pg_background_xacts_per_s"] = round(sum(background[k] for k in xacts), 2)
    report["cost_pg_commits_per_s"] = round(sum(moved[k] for k in xacts) / elapsed, 1)
    for k in ("tup_inserted", "tup_updated", "tup_deleted"):
        report[f"cost_pg_{k}_per_row"] = _per_row(net[k], n)
    report["cost_pg_statements_per_row"] = (
        None if stmts0 is None or stmts1 is None else _per_row(stmts1 - stmts0, n, 2)
    )
    report["cost_wal_bytes_per_row"] = _per_row(net["wal_lsn_bytes"], n, 1)
    report["cost_wal_bytes_per_row_raw"] = _per_row(moved["wal_lsn_bytes"], n, 1)
    report["cost_wal_stat_bytes_per_row"] = _per_row(net["wal_bytes"], n, 1)
    report["cost_wal_records_per_row"] = _per_row(net["wal_records"], n, 2)
    report["cost_wal_fpi_per_row"] = _per_row(net["wal_fpi"], n, 3)
    report["cost_other_db_xacts"] = int(moved["other_db_xacts"])
    # What the job added to each table (heap, indexes, TOAST), and to the whole database.
    grown = {name: size - sizes0.get(name, 0) for name, size in sorted(sizes.items())}
    report["cost_table_bytes_per_row"] = {
        name: round(size / n, 1) for name, size in grown.items() if size > 64 * 1024
    }
    cpu = {name: (cpu1[name] - cpu0[name]) / n * 1e6 for name in cpu0}
    if postmaster:
        cpu["postgres(server)"] = (pg1 - pg0) / n * 1e6
    if beam:
        cpu["rabbitmq(server)"] = (beam1 - beam0) / n * 1e6
    report["cost_cpu_us_per_row"] = {name: round(us, 1) for name, us in sorted(cpu.items())}
    report["cost_peak_rss_mib"] = peaks
    print("\nrow cost:", orjson.dumps({k: v for k, v in report.items() if k.startswith("cost_")}))
