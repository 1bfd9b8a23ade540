"""The chaos driver: run one batch while killing service processes and disrupting servers.

A plan is a shuffled list of faults: ``kill -9`` of each service kind at least once and
of the row-workers several times (each killed process restarted at once, as a
supervisor would), optionally followed by a RabbitMQ and a Postgres disruption. Faults
are paced by progress, not by the clock: before each one the batch must have moved on
by a random number of rows, so every fault lands mid-run on a system that has healed
from the previous one. The batch is then checked by
:func:`tests.helpers.checks.assert_exactly_once`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import asyncpg
import orjson

from tests.chaos.paid import assert_paid_once, paid_check, unconfirmed_shares
from tests.chaos.settings import CHAOS_ENV
from tests.helpers.checks import Verdict, assert_exactly_once, services_of, wait_terminal
from tests.helpers.processes import System, build_system, signed_in, sim_answers
from tests.helpers.support import (
    ApiClient,
    Isolation,
    WebhookReceiver,
    drop_isolation,
    rows,
    wait_until,
)

KILLABLE = ("ingest-api", "scheduler", "dispatcher", "aggregator", "notifier", "offloader")
RESTART_READY_TIMEOUT_S = 60
GATE_TIMEOUT_S = 120

ServerFault = Callable[[], Awaitable[str]]


@dataclass(frozen=True)
class ChaosSettings:
    """The knobs of one chaos run (environment overrides in :func:`from_env`)."""

    rows: int = 5000
    latency_ms: int = 40
    extra_worker_kills: int = 3
    min_step: int = 50
    max_step: int = 200
    seed: int = 0

    @classmethod
    def from_env(cls, rows: int, latency_ms: int, extra_worker_kills: int) -> ChaosSettings:
        """A variant's defaults, each overridable by ``RELAY_CHAOS_ROWS``,
        ``RELAY_CHAOS_LATENCY_MS``, ``RELAY_CHAOS_WORKER_KILLS``; ``RELAY_CHAOS_SEED``
        replays a run (default: a new seed, recorded in the report)."""
        env = os.environ
        return cls(
            rows=int(env.get("RELAY_CHAOS_ROWS", rows)),
            latency_ms=int(env.get("RELAY_CHAOS_LATENCY_MS", latency_ms)),
            extra_worker_kills=int(env.get("RELAY_CHAOS_WORKER_KILLS", extra_worker_kills)),
            seed=int(env.get("RELAY_CHAOS_SEED", time.time_ns() % 1_000_000)),
        )


@dataclass
class Fault:
    """One fault as it happened (``at``: when it struck, Unix seconds; ``until``: when a
    server came back)."""

    kind: str
    target: str
    rows_done: int
    recovered_s: float
    detail: str = ""
    at: float = 0.0
    until: float = 0.0


@dataclass
class ChaosReport:
    """Everything a chaos run did and found (written as JSON under test-output/chaos)."""

    variant: str
    seed: int
    rows: int
    latency_ms: int
    faults: list[Fault] = field(default_factory=list)
    elapsed_s: float = 0.0
    verdict: dict[str, object] = field(default_factory=dict)
    # The simulator's answers per row (tests.helpers.processes.sim_answers): what was paid.
    paid: dict[str, object] = field(default_factory=dict)
    exit_codes: dict[str, int | None] = field(default_factory=dict)

    @property
    def kills(self) -> list[Fault]:
        """The ``kill -9`` faults."""
        return [f for f in self.faults if f.kind == "kill -9"]

    def write(self, directory: Path) -> Path:
        """Write the report as JSON; return its path."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.variant}.json"
        body = asdict(self) | {"kills": len(self.kills), "rounds": len(self.faults)}
        path.write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))
        return path


def chaos_system(
    iso: Isolation, log_dir: Path, settings: ChaosSettings, **overrides: str
) -> System:
    """A system for a chaos run logging to ``log_dir`` (old logs removed): two row-workers,
    :data:`CHAOS_ENV` plus ``overrides``, the simulator at ``settings.latency_ms``."""
    for old in log_dir.glob("*.log"):
        old.unlink()
    return build_system(
        iso,
        log_dir,
        workers=2,
        sim_env={"RELAY_SIM_LATENCY_MS": str(settings.latency_ms)},
        **(CHAOS_ENV | overrides),
    )


def assert_killed_and_clean(
    report: ChaosReport, kinds: Iterable[str], settings: ChaosSettings
) -> None:
    """Each of ``kinds`` was killed, a row-worker ``1 + extra_worker_kills`` times, and
    every process exited 0 on the final SIGTERM."""
    killed = Counter(f.target.split("#")[0] for f in report.kills)
    assert set(killed) == set(kinds), killed
    assert killed["row-worker"] >= 1 + settings.extra_worker_kills, killed
    codes = report.exit_codes
    assert all(code == 0 for code in codes.values()), f"unclean exits after chaos: {codes}"


def kill_plan(
    system: System, rng: random.Random, extra_worker_kills: int, kinds: Sequence[str] = KILLABLE
) -> list[str]:
    """Process names to kill: each of ``kinds`` once and a row-worker, then row-workers
    ``extra_worker_kills`` times more, shuffled."""
    workers = [name for name in system.processes if name.startswith("row-worker")]
    plan = [*kinds, rng.choice(workers)]
    plan += [rng.choice(workers) for _ in range(extra_worker_kills)]
    rng.shuffle(plan)
    return plan


async def rows_done(database_url: str, batch_ids: Sequence[str]) -> tuple[bool, int]:
    """(whether any of the batches is still queued or running, rows with an outcome
    across them), straight from the ledger."""
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        row = await conn.fetchrow(
            "SELECT coalesce(bool_or(status IN ('queued', 'running')), false),"
            " coalesce(sum(completed + failed), 0)::int FROM batches WHERE id = ANY($1)",
            list(batch_ids),
        )
    finally:
        await conn.close()
    assert row is not None
    return row[0], row[1]


async def wait_for_progress(
    database_url: str, batch_ids: Sequence[str], target: int, fault: str
) -> int:
    """Wait until ``target`` rows of the batches are done; fail if every batch ended
    before ``fault`` ran."""

    async def reached() -> int | None:
        unfinished, done = await rows_done(database_url, batch_ids)
        if not unfinished:
            raise AssertionError(
                f"the batches ended before {fault}: make them slower "
                "(RELAY_CHAOS_LATENCY_MS) or the plan shorter"
            )
        return done if done >= target else None

    return int(await wait_until(reached, GATE_TIMEOUT_S, f"{target} rows done", 0.1))


async def kill_and_restart(
    system: System, name: str, http: aiohttp.ClientSession, rows_done: int = 0
) -> Fault:
    """``kill -9`` one process, start it again, wait until ready; the fault, with the
    seconds to ready."""
    proc = system.processes[name]
    killed_at = time.time()
    proc.signal(signal.SIGKILL)
    code = await asyncio.to_thread(proc.wait, 10)
    assert code == -signal.SIGKILL, f"{name} exited with {code} instead of being killed"
    started = time.monotonic()
    proc.start()
    await proc.wait_ready(http, RESTART_READY_TIMEOUT_S)
    recovered = round(time.monotonic() - started, 2)
    return Fault("kill -9", name, rows_done, recovered, at=killed_at)


async def run_kills(
    system: System,
    http: aiohttp.ClientSession,
    batch_ids: Sequence[str],
    plan: list[str],
    rng: random.Random,
    settings: ChaosSettings,
    report: ChaosReport,
) -> int:
    """Kill each process of ``plan`` in turn, each once the batches moved on by a random
    step, recording each fault in ``report``; return the rows done at the last kill."""
    done = 0
    for name in plan:
        step = rng.randint(settings.min_step, settings.max_step)
        done = await wait_for_progress(
            system.iso.database_url, batch_ids, done + step, f"killing {name}"
        )
        report.faults.append(await kill_and_restart(system, name, http, done))
    return done


async def run_chaos(
    variant: str,
    system: System,
    api: ApiClient,
    http: aiohttp.ClientSession,
    webhooks: WebhookReceiver,
    settings: ChaosSettings,
    server_faults: list[tuple[str, ServerFault]],
    *,
    kills: bool = True,
) -> ChaosReport:
    """Submit the batch, run the plan (the kills, unless ``kills`` is False, then the
    server faults), wait for the end, check it; return the report."""
    rng = random.Random(settings.seed)
    report = ChaosReport(variant, settings.seed, settings.rows, settings.latency_ms)
    started = time.monotonic()
    batch = await api.submit(
        {"model": "gpt-4o-mini", "requests": rows(settings.rows), "webhookUrl": webhooks.url}
    )
    url = system.iso.database_url
    plan = kill_plan(system, rng, settings.extra_worker_kills) if kills else []
    done = await run_kills(system, http, [batch["id"]], plan, rng, settings, report)
    for target, fault in server_faults:
        step = rng.randint(settings.min_step, settings.max_step)
        done = await wait_for_progress(url, [batch["id"]], done + step, f"disrupting {target}")
        at, struck = time.monotonic(), time.time()
        detail = await fault()
        back = time.time()
        for proc in services_of(system):
            await proc.wait_ready(http, RESTART_READY_TIMEOUT_S)
        recovered = round(time.monotonic() - at, 2)
        report.faults.append(Fault("server", target, done, recovered, detail, struck, back))
    await wait_terminal(api, batch["id"], 300)
    report.elapsed_s = round(time.monotonic() - started, 1)
    verdict: Verdict = await assert_exactly_once(
        api, url, batch["id"], [f"r-{i}" for i in range(settings.rows)], webhooks
    )
    report.verdict = asdict(verdict)
    await check_paid(report, http, system)
    return report


async def check_paid(report: ChaosReport, http: aiohttp.ClientSession, system: System) -> None:
    """Read what the simulator was paid (``report.paid``) and sort the rows paid twice
    (``report.verdict["paid"]``, see :mod:`tests.chaos.paid`)."""
    report.paid = await sim_answers(http, system)
    kills = [f.at for f in report.kills if f.target.startswith("row-worker")]
    report.verdict["paid"] = asdict(paid_check(report.paid, kills))
    pages = []
    for proc in system.processes.values():
        port = proc.health_port()
        if proc.name.startswith("row-worker") and port is not None and proc.alive():
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                pages.append(await response.text())
    report.verdict["unconfirmed_within"] = unconfirmed_shares(pages)


def assert_paid_once_in(report: ChaosReport) -> None:
    """The run paid for no row twice but in the residual window of a row-worker kill."""
    faults = [(f.kind, f.target, round(f.at, 2), round(f.until, 2)) for f in report.faults]
    check = report.verdict["paid"]
    assert isinstance(check, dict), report.verdict
    assert_paid_once(check, faults)


@dataclass
class ChaosRun:
    """A started chaos system's client (workspace ``chaos``) and, once stopped, the exit
    code of each of its processes."""

    api: ApiClient
    codes: dict[str, int | None] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def chaos_started(system: System, http: aiohttp.ClientSession) -> AsyncIterator[ChaosRun]:
    """Start every process of ``system``; on leaving, stop them all (their exit codes in
    the run) and drop its isolation, however the block ended."""
    codes: dict[str, int | None] = {}
    try:
        await system.start_all(http)
        run = ChaosRun(await signed_in(system, http, "chaos"), codes)
        yield run
    finally:
        codes.update(await asyncio.to_thread(system.stop_all))
        await drop_isolation(system.iso)
