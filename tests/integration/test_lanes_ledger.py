"""Lanes on the real Postgres: the plan a dispatcher records when it claims a job, the
offloader's ramp and insurance verdicts on a submitted provider batch, moving its rows
(a row paid once: later answers for moved rows discarded and counted), and the lane and
cost per lane recorded with each outcome."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import orjson

from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore, RunningJob
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.offload import BatchState, Gathering, OffloadBatch, OffloadStore, RowState
from relay_batches.ledger.offload.records import BATCH_COLUMNS, batch_of
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.messages import RowOutcome
from relay_batches.model import JobStatus
from relay_batches.router.aliases import AliasTable, parse_aliases
from relay_batches.services.dispatcher.lanes import LanePlanner
from relay_batches.services.offloader.lanes import RAMP, STALLED, LaneWatch
from tests.helpers.offload import OWNER, intake_all, leads, offloaded_job, request

BASE = "http://127.0.0.1:9/v1"


def routes(deployment: str, rows_per_s: float) -> AliasTable:
    """Alias ``half``: ``deployment`` (a provider batch expected in an hour), then a
    realtime deployment answering ``rows_per_s``."""
    return parse_aliases(
        {
            "deployments": {
                deployment: {
                    "provider": "openai-batch",
                    "base_url": BASE,
                    "model": "m",
                    "turnaround": "1h",
                    "price": {"prompt_per_mtok": 1.0, "completion_per_mtok": 2.0},
                },
                "rt": {
                    "provider": "openai",
                    "base_url": BASE,
                    "model": "m",
                    "rows_per_s": rows_per_s,
                    "price": {"prompt_per_mtok": 2.0, "completion_per_mtok": 4.0},
                },
            },
            "aliases": {"half": {"deployments": [deployment, "rt"]}},
        },
        {},
    )


async def submitted_batch(
    pool: asyncpg.Pool, deployment: str, rows: int, deadline_s: float
) -> tuple[str, int]:
    """An offloaded job of ``rows`` rows due in ``deadline_s``, all in one provider batch
    the provider holds: the job's id and the record's."""
    store = OffloadStore(pool)
    batch_id, _ = await offloaded_job(pool, rows, deployment)
    await pool.execute(
        "UPDATE batches SET expires_at = now() + make_interval(secs => $2) WHERE id = $1",
        batch_id,
        deadline_s,
    )
    await intake_all(store, leads(deployment))
    made = await store.gather(
        Gathering(deployment, 1000, 10_000_000, linger_s=0, window_s=0, margin_s=0)
    )
    assert made is not None
    assert made in [b.id for b in await store.claim(OWNER, [BatchState.RECORDED], 30, 100)]
    assert await store.set_submitted(made, OWNER, f"pb-{made}")
    return batch_id, made


async def record_of(store: OffloadStore, made: int) -> OffloadBatch:
    """The record as the offloader's poll holds it."""
    found = await store.pool.fetchrow(
        f"SELECT {BATCH_COLUMNS} FROM offload_batches WHERE id = $1", made
    )
    return batch_of(found)


async def test_the_ramp_moves_rows_the_fast_lanes_could_only_just_finish(
    pool: asyncpg.Pool,
) -> None:
    store = OffloadStore(pool)
    # 10 rows at 1 a second take 10 s: past 70% of the 5 s left, they must move.
    batch_id, made = await submitted_batch(pool, "ob-lanes-ramp", 10, 5)
    watch = LaneWatch(store, routes("ob-lanes-ramp", 1))
    assert await watch.verdict(await record_of(store, made)) == RAMP
    # Fast lanes of 1,000 rows a second finish them in 0.01 s: no ramp yet, nor a stall.
    assert (
        await LaneWatch(store, routes("ob-lanes-ramp", 1000)).verdict(await record_of(store, made))
        is None
    )

    assert await store.move(made, OWNER, RAMP) == 10
    assert await store.move(made, OWNER, RAMP) == 0, "moved once"
    # Moved: its verdict stays (a cancel that failed is tried again at the next poll).
    assert (
        await LaneWatch(store, routes("ob-lanes-ramp", 1000)).verdict(await record_of(store, made))
        == RAMP
    )
    states = await pool.fetch(
        "SELECT DISTINCT state FROM offload_rows WHERE batch_id = $1", batch_id
    )
    assert {r[0] for r in states} == {RowState.FORWARD}
    # The provider batch answers them after all: discarded, counted, never recorded.
    waiting, moved = await store.still_submitted([(batch_id, i) for i in range(10)])
    assert (waiting, moved) == (set(), 10)
    assert await pool.fetchval("SELECT late_answers FROM batches WHERE id = $1", batch_id) == 10
    reason = await pool.fetchval("SELECT moved_reason FROM offload_batches WHERE id = $1", made)
    assert reason == RAMP


async def test_a_batch_quiet_past_its_expected_turnaround_is_stalled(pool: asyncpg.Pool) -> None:
    store = OffloadStore(pool)
    _, made = await submitted_batch(pool, "ob-lanes-stall", 3, 86_400)
    watch = LaneWatch(store, routes("ob-lanes-stall", 1000))
    assert await watch.verdict(await record_of(store, made)) is None
    # Progress an hour ago, nothing since: 1.5 × the hour expected is not over yet.
    await pool.execute(
        "UPDATE offload_batches SET submitted_at = now() - interval '2 hours',"
        " progressed_at = now() - interval '1 hour' WHERE id = $1",
        made,
    )
    assert await watch.verdict(await record_of(store, made)) is None
    await pool.execute(
        "UPDATE offload_batches SET progressed_at = now() - interval '91 minutes' WHERE id = $1",
        made,
    )
    assert await watch.verdict(await record_of(store, made)) == STALLED


async def test_the_plan_offloads_what_fits_and_records_itself(pool: asyncpg.Pool) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"lanes-{new_id()[:8]}")
    table = routes("ob-lanes-plan", 10)
    planner = LanePlanner(pool, table)

    async def job(window: timedelta | None, budget: float | None = None) -> RunningJob:
        rows = [(f"c-{i}", request(i)) for i in range(20)]
        created = await JobStore(pool).create(
            NewJob(
                new_id(),
                workspace,
                "p",
                "half",
                0,
                20,
                None,
                None,
                None,
                completion_window=window,
                budget_usd=budget,
            ),
            rows,
        )
        record = await pool.fetchrow("SELECT expires_at FROM batches WHERE id = $1", created.id)
        return RunningJob(
            created.id,
            "half",
            0,
            20,
            0,
            0,
            JobStatus.RUNNING,
            0,
            created.id,
            "{}",
            workspace,
            record[0],
            budget_usd=budget,
        )

    day = await job(timedelta(hours=24))
    assert await planner(day) == "ob-lanes-plan"  # 1.5 h + 20 rows at 10/s: fits 24 h
    plan = orjson.loads(await pool.fetchval("SELECT lane_plan FROM batches WHERE id = $1", day.id))
    assert plan["steps"][0]["lane"] == "batch" and plan["fits"]
    hour = await job(timedelta(hours=1))
    assert await planner(hour) is None  # the batch lane does not fit an hour
    plan = orjson.loads(await pool.fetchval("SELECT lane_plan FROM batches WHERE id = $1", hour.id))
    assert [s["lane"] for s in plan["steps"]] == ["realtime"]
    budgeted = await job(None, budget=100.0)
    assert await planner(budgeted) == "ob-lanes-plan"  # a budget may take the batch lane
    assert (
        await DispatchStore(pool).offload(OWNER, budgeted.id, 20, "ob-lanes-plan") is False
    )  # not ours: no lease


async def test_each_outcome_records_its_lane_and_the_job_its_cost_per_lane(
    pool: asyncpg.Pool,
) -> None:
    batch_id, _ = await offloaded_job(pool, 3, "ob-lanes-cost")
    outcomes = [
        RowOutcome(batch_id, 0, "a", None, 1, deployment="ob", cost_usd=0.5, lane="batch"),
        RowOutcome(batch_id, 1, "b", None, 1, deployment="f", cost_usd=0.25, lane="flex"),
        RowOutcome(batch_id, 2, "c", None, 1, deployment="rt", cost_usd=1.0),
    ]
    await OutcomeStore(pool).record(outcomes)
    await OutcomeStore(pool).record(outcomes)  # redelivered: nothing added
    lanes = await pool.fetch(
        "SELECT row_index, lane FROM row_results WHERE batch_id = $1 ORDER BY 1", batch_id
    )
    assert [r[1] for r in lanes] == ["batch", "flex", "realtime"]
    job = await pool.fetchrow(
        "SELECT cost_usd, cost_batch_usd, cost_flex_usd, cost_realtime_usd, rows_batch, rows_flex,"
        " rows_realtime FROM batches WHERE id = $1",
        batch_id,
    )
    assert tuple(job) == (1.75, 0.5, 0.25, 1.0, 1, 1, 1)
