"""Shared rate limits on the real broker: three workers (each its own Bus connection,
SharedLimiter and Keeper, run by the same declarations as the row-worker's) drive rows
through real ModelRouters against the simulator enforcing the limit per calendar second.

Checked: exactly one leader; the limit holds (the rows take at least as long as the limit
allows) with few 429s (a share of the calls: on a loaded machine a late grant can still
land a call in the next second); the tpm variant; leader failover; a throttle event
lowers every worker's rate; a waiting call cancelled leaves nothing behind. How close to
the limit the rows run is a speed goal, measured by the bench, not asserted here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import aio_pika
import pytest
from aiohttp.test_utils import TestServer

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import Names
from relay_batches.ids import new_id
from relay_batches.kit.tasks import Tasks
from relay_batches.ratelimit.keeper import Keeper
from relay_batches.ratelimit.limiter import SharedLimiter
from relay_batches.ratelimit.limits import RateLimit
from relay_batches.ratelimit.parts import rate_limit_parts
from relay_batches.router.aliases import AliasTable, Deployment
from relay_batches.router.http1 import Http1Client
from relay_batches.router.policy import BackoffPolicy
from relay_batches.router.router import ModelRouter
from relay_batches.services.row_worker.__main__ import shared_limits
from relay_batches.services.upstream_sim.app import STATE_KEY, build_app
from relay_batches.services.upstream_sim.config import SimConfig
from tests.helpers.support import AMQP_URL, wait_until

CONCURRENCY = 16
DEPLOYMENT = "sim"
THROTTLED_SHARE = 0.05  # of the calls, at most
TAKE_OVER_S = 10.0  # a new leader within (the next election pass is 1 s away)


@dataclass
class Worker:
    """One row-worker's rate-limit machinery and router, in this process."""

    bus: Bus
    keeper: Keeper
    limiter: SharedLimiter
    router: ModelRouter
    tasks: Tasks = field(default_factory=Tasks)
    halt: asyncio.Event = field(default_factory=asyncio.Event)

    async def stop(self) -> None:
        self.halt.set()
        for task in self.tasks.running():
            task.cancel()
        await asyncio.gather(*self.tasks.running(), return_exceptions=True)
        await self.bus.close()


async def start_worker(
    names: Names, index: int, aliases: AliasTable, session: Http1Client
) -> Worker:
    bus = Bus(AMQP_URL, names, f"ratelimit-test-{index}")
    await bus.connect()
    keeper, limiter = shared_limits(aliases, bus, f"worker-{index}")  # the row-worker's wiring
    assert keeper is not None and limiter is not None
    router = ModelRouter(aliases, session, BackoffPolicy(0.05, 2.0), limiter=limiter)
    worker = Worker(bus, keeper, limiter, router)
    parts = rate_limit_parts(keeper, limiter)
    for intake in parts.intakes:
        await intake.start(bus, worker.tasks, worker.halt)
    for periodic in parts.periodic:
        worker.tasks.spawn(periodic.loop(worker.halt), name=periodic.name, loop=True)
    return worker


@dataclass
class Fleet:
    names: Names
    sim: TestServer
    workers: list[Worker]

    def stats(self) -> dict[str, int]:
        return self.sim.app[STATE_KEY].stats()

    def leaders(self) -> list[Worker]:
        return [w for w in self.workers if w.keeper.leader]


async def start_fleet(
    sim_config: SimConfig, limit: RateLimit, session: Http1Client, workers: int = 3
) -> Fleet:
    sim = TestServer(build_app(sim_config))
    await sim.start_server()
    deployment = Deployment(
        name=DEPLOYMENT,
        provider="openai",
        base_url=str(sim.make_url("/v1")),
        model="sim-echo",
        timeout_s=10.0,
        max_retries=5,
        limit=limit,
    )
    aliases = AliasTable({"m": (deployment,)})
    names = Names(f"trl{new_id()[:10]}")
    started = [await start_worker(names, i, aliases, session) for i in range(workers)]
    fleet = Fleet(names, sim, started)
    await wait_until(_one_leader(fleet), 5.0, "a leader")
    return fleet


def _one_leader(fleet: Fleet):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return len(fleet.leaders()) == 1

    return check


async def stop_fleet(fleet: Fleet) -> None:
    for worker in fleet.workers:
        await worker.stop()
    await fleet.sim.close()
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        for queue in (*fleet.names.durable_queues(), fleet.names.ratelimit_grants(DEPLOYMENT)):
            await channel.queue_delete(queue)
        await channel.exchange_delete(fleet.names.events)


@pytest.fixture
async def session() -> AsyncIterator[Http1Client]:
    client = Http1Client()
    yield client
    await client.close()


@dataclass
class Run:
    rows: int
    ok: int
    elapsed_s: float
    finished_at: list[float]


async def run_rows(
    workers: Sequence[Worker], rows: int, content: str, params: dict[str, int] | None = None
) -> Run:
    """``rows`` rows through the workers' routers, each worker ``CONCURRENCY`` at a time
    (the rows shared out first come, first served, as the rows queue does)."""
    todo: asyncio.Queue[int] = asyncio.Queue()
    for index in range(rows):
        todo.put_nowait(index)
    ok, finished_at = 0, []
    started = time.monotonic()

    async def slot(worker: Worker) -> None:
        nonlocal ok
        while not todo.empty():
            index = todo.get_nowait()
            messages = [{"role": "user", "content": f"{content} {index:04d}"}]
            result = await worker.router.complete("m", messages, params or {})
            ok += result.completion is not None
            finished_at.append(time.monotonic() - started)

    await asyncio.gather(*(slot(w) for w in workers for _ in range(CONCURRENCY)))
    return Run(rows, ok, time.monotonic() - started, finished_at)


def report(name: str, run: Run, stats: dict[str, int], limit_per_s: float) -> None:
    rate = run.rows / run.elapsed_s
    share = stats["throttled"] / max(1, stats["calls"])
    print(
        f"\n{name}: {run.rows} rows in {run.elapsed_s:.2f} s = {rate:.2f} rows/s "
        f"({rate / limit_per_s:.3f} x limit {limit_per_s:g}/s); calls {stats['calls']}, "
        f"throttled {stats['throttled']} ({share:.2%})"
    )


async def test_three_workers_hold_600_rpm_together(session: Http1Client) -> None:
    fleet = await start_fleet(SimConfig(rpm=600), RateLimit(rpm=600), session)
    try:
        assert len(fleet.leaders()) == 1
        run = await run_rows(fleet.workers, 150, "hello")
        stats = fleet.stats()
        report("rpm 600", run, stats, 10.0)
        assert run.ok == 150
        assert stats["throttled"] <= THROTTLED_SHARE * stats["calls"]
        assert stats["calls"] == 150 + stats["throttled"]
        assert run.elapsed_s >= 14.0  # 150 rows at 10/s: the limit held
        assert len(fleet.leaders()) == 1
    finally:
        await stop_fleet(fleet)


async def test_three_workers_hold_a_token_limit_together(session: Http1Client) -> None:
    # Each row counts 2 prompt tokens ("hi 0001": 7 chars) + max_tokens 98 = 100 tokens;
    # 36,000 tpm is 600 tokens a second: 6 rows a second.
    fleet = await start_fleet(SimConfig(tpm=36_000), RateLimit(tpm=36_000), session)
    try:
        run = await run_rows(fleet.workers, 72, "hi", {"max_tokens": 98})
        stats = fleet.stats()
        report("tpm 36000", run, stats, 6.0)
        assert run.ok == 72
        assert stats["throttled"] <= THROTTLED_SHARE * stats["calls"]
        assert run.elapsed_s >= 11.0  # 72 rows at 6/s: the limit held
    finally:
        await stop_fleet(fleet)


async def test_leader_failover_keeps_rows_flowing(session: Http1Client) -> None:
    fleet = await start_fleet(SimConfig(rpm=600), RateLimit(rpm=600), session)
    try:
        (leader,) = fleet.leaders()
        others = [w for w in fleet.workers if w is not leader]
        rows = asyncio.ensure_future(run_rows(others, 100, "failover"))
        await wait_until(_calls_reached(fleet, 20), 10.0, "rows flowing")
        closed_at = time.monotonic()
        await leader.bus.close()
        assert not leader.keeper.leader

        async def new_leader() -> bool:
            return any(w.keeper.leader for w in others)

        await wait_until(new_leader, TAKE_OVER_S, "another leader")
        took_over_s = time.monotonic() - closed_at
        assert sum(w.keeper.leader for w in fleet.workers) == 1
        run = await rows
        stats = fleet.stats()
        report(f"failover (new leader after {took_over_s:.2f} s)", run, stats, 10.0)
        assert took_over_s <= TAKE_OVER_S
        assert run.ok == 100
        assert stats["throttled"] <= THROTTLED_SHARE * stats["calls"]
    finally:
        await stop_fleet(fleet)


def _calls_reached(fleet: Fleet, calls: int):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return fleet.stats()["calls"] >= calls

    return check


async def test_a_throttle_event_lowers_every_workers_rate(
    session: Http1Client,
) -> None:
    fleet = await start_fleet(SimConfig(rpm=600), RateLimit(rpm=600), session)
    try:
        await fleet.workers[1].limiter.throttled(DEPLOYMENT, None)

        async def all_lowered() -> bool:
            return all(w.keeper.pacers[DEPLOYMENT].fraction < 0.85 for w in fleet.workers)

        await wait_until(all_lowered, 3.0, "every pacer lowered")
    finally:
        await stop_fleet(fleet)


async def test_a_waiting_call_cancelled_leaves_no_waiter(session: Http1Client) -> None:
    fleet = await start_fleet(SimConfig(), RateLimit(rpm=600), session)
    try:
        for worker in fleet.workers:
            worker.keeper.pacers[DEPLOYMENT].throttled(time.time(), 60.0)  # issues nothing
        limiter = fleet.workers[0].limiter
        call = asyncio.ensure_future(limiter.acquire(DEPLOYMENT, 1))

        async def waiting() -> bool:
            return limiter.waiting(DEPLOYMENT) == 1 and limiter.subscribed(DEPLOYMENT)

        await wait_until(waiting, 3.0, "the call waiting, grants subscribed")
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        assert call.cancelled()
        assert limiter.waiting(DEPLOYMENT) == 0

        async def unsubscribed() -> bool:
            return not limiter.subscribed(DEPLOYMENT)

        await wait_until(unsubscribed, 3.0, "the idle grants consumer cancelled")
    finally:
        await stop_fleet(fleet)
