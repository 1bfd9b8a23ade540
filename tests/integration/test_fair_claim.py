"""The fair claim on the real ledger: workspaces take turns, the per-workspace cap,
claims that outrank, and several dispatchers claiming at once.

The module has a database of its own, so no other test's queued jobs take a turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.ledger.pool import create_pool
from relay_batches.messages import JobEvent, RowOutcome, SliceMessage
from relay_batches.model import JobStatus
from relay_batches.services.dispatcher.core import DispatchConfig, Dispatcher
from tests.helpers.support import create_isolation, drop_isolation

LEASE_S = 30.0


@pytest.fixture
async def fresh() -> AsyncIterator[asyncpg.Pool]:
    """A pool on a database of this test's own (claims see every queued job)."""
    iso = await create_isolation("fair")
    pool = await create_pool(iso.database_url, max_size=8)
    try:
        yield pool
    finally:
        await pool.close()
        await drop_isolation(iso)


class Ledger:
    """Queue jobs by workspace name and finish them, as the API and aggregator would."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.store = DispatchStore(pool)
        self.names: dict[str, str] = {}
        self.sizes: dict[str, int] = {}

    async def queue(self, workspace: str, label: str, priority: int = 0, total: int = 2) -> str:
        """A queued job of ``workspace`` named ``label``; return its id."""
        space = await KeyStore(self.pool).ensure_workspace(f"fair-{workspace}")
        job_id = new_id()
        await JobStore(self.pool).create(
            NewJob(job_id, space, label, "gpt-4o-mini", priority, total, None, None, None),
            ((f"c-{i}", '[{"role":"user","content":"x"}]') for i in range(total)),
        )
        self.names[job_id], self.sizes[job_id] = label, total
        return job_id

    async def claim(self, limit: int, per_workspace: int = 0, owner: str = "d1") -> list[str]:
        """Labels of the jobs one claim took (highest priority first)."""
        claimed = await self.store.claim_queued(owner, limit, LEASE_S, per_workspace)
        return [self.names[job.id] for job in claimed]

    async def finish(self, label: str) -> None:
        """Every row of job ``label`` gets an outcome (the job completes, its slot frees)."""
        (job_id,) = [i for i, name in self.names.items() if name == label]
        await OutcomeStore(self.pool).record(
            [RowOutcome(job_id, i, "ok", None, 1) for i in range(self.sizes[job_id])]
        )


async def test_claims_alternate_between_workspaces_as_slots_free_up(
    fresh: asyncpg.Pool,
) -> None:
    ledger = Ledger(fresh)
    for label in ("a1", "a2", "a3"):
        await ledger.queue("A", label)
    await ledger.queue("B", "b1")
    await ledger.queue("B", "b2")

    assert await ledger.claim(1) == ["a1"]  # oldest first while nobody ran
    await ledger.finish("a1")
    assert await ledger.claim(1) == ["b1"]  # A was served last: B's turn
    await ledger.finish("b1")
    assert await ledger.claim(1) == ["a2"]
    await ledger.finish("a2")
    assert await ledger.claim(1) == ["b2"]
    await ledger.finish("b2")
    assert await ledger.claim(1) == ["a3"]


async def test_two_free_slots_go_to_two_workspaces_even_behind_a_long_queue(
    fresh: asyncpg.Pool,
) -> None:
    ledger = Ledger(fresh)
    for i in range(12):
        await ledger.queue("A", f"a{i}")
    await ledger.queue("B", "b0")
    assert sorted(await ledger.claim(2)) == ["a0", "b0"]
    # While a0 runs, A's next job ranks behind a workspace with nothing running.
    await ledger.queue("C", "c0")
    assert await ledger.claim(1) == ["c0"]
    assert await ledger.claim(3) == ["a1", "a2", "a3"]


async def test_priority_orders_the_jobs_within_a_workspace_only(fresh: asyncpg.Pool) -> None:
    ledger = Ledger(fresh)
    await ledger.queue("A", "a-low", priority=0)
    await ledger.queue("A", "a-high", priority=100)
    await ledger.queue("B", "b-low", priority=-5)
    # A's priority 100 picks A's job, but does not put A's second job ahead of B's first.
    assert sorted(await ledger.claim(2)) == ["a-high", "b-low"]
    assert await ledger.claim(2) == ["a-low"]


async def test_the_per_workspace_cap_counts_running_jobs(fresh: asyncpg.Pool) -> None:
    ledger = Ledger(fresh)
    for i in range(4):
        await ledger.queue("A", f"a{i}")
    await ledger.queue("B", "b0")
    assert sorted(await ledger.claim(10, per_workspace=2)) == ["a0", "a1", "b0"]
    assert await ledger.claim(10, per_workspace=2) == []
    await ledger.finish("a0")
    assert await ledger.claim(10, per_workspace=2) == ["a2"]


async def test_dispatchers_claiming_at_once_never_share_a_job_nor_pass_the_cap(
    fresh: asyncpg.Pool,
) -> None:
    ledger = Ledger(fresh)
    for space in "ABCD":
        for i in range(5):
            await ledger.queue(space, f"{space}{i}")
    rounds = [ledger.claim(3, per_workspace=2, owner=f"d{n}") for n in range(8)]
    claimed = [label for labels in await asyncio.gather(*rounds) for label in labels]
    assert len(claimed) == len(set(claimed))
    per_space = {space: sum(1 for c in claimed if c[0] == space) for space in "ABCD"}
    assert all(count <= 2 for count in per_space.values()), per_space
    owners = await fresh.fetch("SELECT lease_owner FROM batches WHERE status = 'running'")
    assert len(owners) == len(claimed)


async def test_only_jobs_above_our_highest_of_their_workspace_are_claimed_outranking(
    fresh: asyncpg.Pool,
) -> None:
    ledger = Ledger(fresh)
    space_a = await KeyStore(fresh).ensure_workspace("fair-A")
    await ledger.queue("A", "a-mid", priority=5)
    await ledger.queue("A", "a-top", priority=50)
    await ledger.queue("A", "a-top2", priority=40)
    await ledger.queue("B", "b-top", priority=100)
    claimed = await ledger.store.claim_outranking("d1", {space_a: 5}, 10, LEASE_S)
    assert [ledger.names[job.id] for job in claimed] == ["a-top", "a-top2"]
    assert {job.workspace_id for job in claimed} == {space_a}
    assert await ledger.store.claim_outranking("d1", {}, 10, LEASE_S) == []


class Releases:
    """What a dispatcher published, by job."""

    def __init__(self) -> None:
        self.jobs: set[str] = set()

    async def publish(self, task: SliceMessage, level: int) -> None:
        self.jobs.add(task.batch_id)

    async def announce(self, event: JobEvent) -> None:
        raise AssertionError(f"unexpected job failure {event}")


async def statuses(ledger: Ledger) -> dict[str, str]:
    """Every job's status by label."""
    records = await ledger.pool.fetch("SELECT id, status FROM batches")
    return {ledger.names[r["id"]]: r["status"] for r in records}


async def two_slots_running_a(ledger: Ledger) -> tuple[Releases, DispatchConfig, Dispatcher]:
    """A dispatcher of two slots (a window of 8 rows) running A's jobs a0 and a1, each
    longer than the window: they still have rows to release when outranked."""
    releases = Releases()
    config = DispatchConfig("d1", window=8, slice_rows=2, max_running_jobs=2, lease_s=LEASE_S)
    dispatcher = Dispatcher(
        ledger.store, releases.publish, releases.announce, lambda _: True, config
    )
    await ledger.queue("A", "a0", total=40)
    await ledger.queue("A", "a1", total=40)
    await dispatcher.claim()
    return releases, config, dispatcher


async def test_a_workspace_raising_its_priorities_never_keeps_another_out_of_the_slots(
    fresh: asyncpg.Pool,
) -> None:
    ledger = Ledger(fresh)
    releases, config, dispatcher = await two_slots_running_a(ledger)
    b0 = await ledger.queue("B", "b0", total=40)
    await dispatcher.claim()
    assert (await statuses(ledger))["b0"] == "queued"  # both slots run A's jobs
    for priority in (1, 2, 3):
        await ledger.queue("A", f"a{priority + 1}", priority=priority, total=40)
        await dispatcher.reconcile()
    space_b = await KeyStore(fresh).ensure_workspace("fair-B")
    finished = next(o.job for o in dispatcher.jobs.values() if o.job.workspace_id != space_b)
    await ledger.finish(ledger.names[finished.id])
    await dispatcher.on_progress(
        JobEvent(finished.id, JobStatus.COMPLETED, finished.total, finished.total, 0)
    )
    for _ in range(3):
        await dispatcher.reconcile()
        assert (await statuses(ledger))["b0"] == "running"
        assert b0 in releases.jobs
        slots = [o for o in dispatcher.jobs.values() if not o.held]
        assert len(slots) <= config.max_running_jobs
        assert len(dispatcher.jobs) <= 2 * config.max_running_jobs


async def test_the_per_workspace_cap_holds_for_jobs_that_outrank(fresh: asyncpg.Pool) -> None:
    ledger = Ledger(fresh)
    space_a = await KeyStore(fresh).ensure_workspace("fair-A")
    await ledger.queue("A", "a0")
    await ledger.queue("A", "a1")
    assert sorted(await ledger.claim(2)) == ["a0", "a1"]
    await ledger.queue("A", "a-top", priority=9)
    assert await ledger.store.claim_outranking("d1", {space_a: 0}, 10, LEASE_S, 2) == []
    await ledger.finish("a0")
    claimed = await ledger.store.claim_outranking("d1", {space_a: 0}, 10, LEASE_S, 2)
    assert [ledger.names[job.id] for job in claimed] == ["a-top"]


async def test_a_job_that_would_park_at_once_is_not_claimed_into_a_slot(
    fresh: asyncpg.Pool,
) -> None:
    """A runs a0, a1 (priority 0) in both slots and then outranks them with a-top (50),
    which frees a slot as they park. A's next priority-0 job would only park too, taking
    room and releasing nothing, so it stays queued; B, arriving later, gets the slot."""
    ledger = Ledger(fresh)
    releases, _, dispatcher = await two_slots_running_a(ledger)
    await ledger.queue("A", "a-top", priority=50, total=400)
    await ledger.queue("A", "a2", total=40)
    await dispatcher.claim()
    assert (await statuses(ledger))["a2"] == "queued", "it would have parked at once"
    b0 = await ledger.queue("B", "b0", total=40)
    await dispatcher.claim()
    assert (await statuses(ledger))["b0"] == "running"
    assert b0 in releases.jobs
