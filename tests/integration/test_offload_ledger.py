"""The offload ledger on the real Postgres: a dispatcher's mark, intake of the released
rows, gathering them into provider batches by rows, bytes and linger, cancel and pause,
the leased life of a provider batch (a crash between recording and creating resumes
with the same record, never a second one), settling and forwarding."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import orjson
import pytest

from relay_batches.ids import new_id
from relay_batches.ledger import dispatch
from relay_batches.ledger.deletion import JobDeletion
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.offload import (
    ANALYZE_AFTER_ROWS,
    BatchState,
    ForwardRow,
    Gathering,
    OffloadStore,
    RowState,
)
from relay_batches.ledger.row_model import row_model
from relay_batches.messages import JobEvent, SliceMessage
from relay_batches.router.aliases import AliasTable, parse_aliases
from relay_batches.services.dispatcher.core import DispatchConfig, Dispatcher
from relay_batches.services.dispatcher.lanes import LanePlanner
from tests.helpers.offload import (
    OWNER,
    ended_provider_batch,
    intake_all,
    leads,
    offloaded_job,
    request,
)


async def row_states(pool: asyncpg.Pool, batch_id: str) -> dict[str, int]:
    records = await pool.fetch(
        "SELECT state, count(*) FROM offload_rows WHERE batch_id = $1 GROUP BY state", batch_id
    )
    return {r[0]: r[1] for r in records}


async def test_the_mark_releases_every_row_once_and_only_before_any_release(
    pool: asyncpg.Pool,
) -> None:
    batch_id, _ = await offloaded_job(pool, 5, "ob-mark")
    record = await pool.fetchrow(
        "SELECT dispatched_upto, offload_deployment, offload_upto FROM batches WHERE id = $1",
        batch_id,
    )
    assert tuple(record) == (5, "ob-mark", 0)
    assert not await DispatchStore(pool).offload(OWNER, batch_id, 5, "other")
    # Its lease gone, no dispatcher takes it over: the offloader owns its rows.
    await DispatchStore(pool).release(OWNER, [batch_id])
    async with pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        try:  # what a takeover would claim, undone (other tests' jobs stay as they are)
            taken = await conn.fetch(dispatch._CLAIM_EXPIRED, "another-dispatcher", 100_000, 30)
        finally:
            await transaction.rollback()
    assert batch_id not in [r["id"] for r in taken]


async def test_intake_records_rows_under_their_own_alias_in_bounded_steps(
    pool: asyncpg.Pool,
) -> None:
    store = OffloadStore(pool)
    batch_id, _ = await offloaded_job(
        pool, 25, "ob-intake", models={3: "realtime-only", 4: "other-half"}
    )
    await intake_all(store, leads("ob-intake"), step=10)
    assert await row_states(pool, batch_id) == {"pending": 24, "forward": 1}
    forwarded = await pool.fetchval(
        "SELECT array_agg(row_index) FROM offload_rows WHERE batch_id = $1 AND state = 'forward'",
        batch_id,
    )
    assert forwarded == [3]
    upto = await pool.fetchval("SELECT offload_upto FROM batches WHERE id = $1", batch_id)
    assert upto == 25
    assert await store.intake(leads("ob-intake"), step=10) == 0


async def test_intake_matches_a_dated_name_to_its_aliass_pattern(pool: asyncpg.Pool) -> None:
    store = OffloadStore(pool)
    models = {1: "half-2024-07-18", 2: "rt-2024", 3: "rt", 4: "nowhere-1"}
    batch_id, _ = await offloaded_job(pool, 5, "ob-pattern", models=models)
    # "rt" is an alias no batch deployment leads: its own rows and the dated names its
    # pattern "rt-*" matches go realtime; the longer "half-*" beats "h*".
    routes = {"half": "ob-pattern", "rt": ""}
    patterns = [("half-", "ob-pattern"), ("rt-", ""), ("h", "ob-elsewhere")]
    await intake_all(store, routes, step=100, patterns=patterns)
    states = await pool.fetch(
        "SELECT row_index, state, deployment FROM offload_rows WHERE batch_id = $1"
        " ORDER BY row_index",
        batch_id,
    )
    assert [tuple(r) for r in states] == [
        (0, "pending", "ob-pattern"),
        (1, "pending", "ob-pattern"),
        (2, "forward", ""),
        (3, "forward", ""),
        (4, "forward", ""),
    ]


async def test_a_deployment_gone_from_the_routes_forwards_every_row(pool: asyncpg.Pool) -> None:
    store = OffloadStore(pool)
    batch_id, _ = await offloaded_job(pool, 6, "ob-gone")
    await intake_all(store, {}, step=100)
    assert await row_states(pool, batch_id) == {"forward": 6}


async def test_gather_by_rows_then_by_linger(pool: asyncpg.Pool) -> None:
    store = OffloadStore(pool)
    batch_id, _ = await offloaded_job(pool, 25, "ob-rows")
    await intake_all(store, leads("ob-rows"))
    slow = Gathering("ob-rows", max_rows=10, max_bytes=10_000_000, linger_s=3600)
    first = await store.gather(slow)
    second = await store.gather(slow)
    assert first is not None and second is not None and first != second
    assert await store.gather(slow) is None, "5 rows left: neither full nor lingered"
    assert await row_states(pool, batch_id) == {"submitted": 20, "pending": 5}
    third = await store.gather(Gathering("ob-rows", 10, 10_000_000, linger_s=0))
    assert third is not None
    sizes = await pool.fetch(
        "SELECT rows, state FROM offload_batches WHERE id = ANY($1::bigint[]) ORDER BY id",
        [first, second, third],
    )
    assert [tuple(r) for r in sizes] == [(10, "recorded"), (10, "recorded"), (5, "recorded")]
    lines = await store.lines(first, None, 4, 10_000_000)
    assert [(line.batch_id, line.row_index) for line in lines] == [(batch_id, i) for i in range(4)]
    one = await store.lines(first, None, 100, 1)
    assert [line.row_index for line in one] == [0], "a page cut by bytes holds one row at least"
    size = await pool.fetchval(
        "SELECT bytes FROM offload_rows WHERE batch_id = $1 LIMIT 1", batch_id
    )
    two = await store.lines(first, None, 100, 2 * size)
    assert [line.row_index for line in two] == [0, 1]
    after = await store.lines(first, (batch_id, 3), 100, 10_000_000)
    assert [line.row_index for line in after] == list(range(4, 10))
    assert orjson.loads(after[0].request) == [{"role": "user", "content": "row 4"}]


async def test_gather_by_bytes_keeps_each_batch_within_its_budget(pool: asyncpg.Pool) -> None:
    store = OffloadStore(pool)
    batch_id, _ = await offloaded_job(pool, 10, "ob-bytes")
    await intake_all(store, leads("ob-bytes"))
    size = await pool.fetchval("SELECT max(bytes) FROM offload_rows WHERE batch_id = $1", batch_id)
    budget = 3 * (size + 100)
    gathering = Gathering(
        "ob-bytes", max_rows=1000, max_bytes=budget, linger_s=3600, line_extra=100
    )
    made = [await store.gather(gathering) for _ in range(3)]
    assert all(m is not None for m in made)
    counts = await pool.fetch(
        "SELECT rows, bytes FROM offload_batches WHERE id = ANY($1::bigint[]) ORDER BY id", made
    )
    assert [r[0] for r in counts] == [3, 3, 3]
    assert all(r[1] <= budget for r in counts)
    assert await store.gather(gathering) is None, "one row left, under the budget"


async def test_cancel_drops_pending_rows_and_pause_holds_them(pool: asyncpg.Pool) -> None:
    store = OffloadStore(pool)
    canceled, workspace = await offloaded_job(pool, 4, "ob-hold")
    paused, paused_workspace = await offloaded_job(pool, 3, "ob-hold")
    await intake_all(store, leads("ob-hold"))
    await JobStore(pool).cancel(workspace, canceled)
    await JobStore(pool).pause(paused_workspace, paused)
    assert await store.drop_ended() == 4
    assert await store.gather(Gathering("ob-hold", 100, 10_000_000, linger_s=0)) is None
    assert await row_states(pool, canceled) == {"dropped": 4}
    assert await row_states(pool, paused) == {"pending": 3}


async def test_a_record_left_by_a_crash_is_resumed_by_the_next_owner_alone(
    pool: asyncpg.Pool,
) -> None:
    store = OffloadStore(pool)
    await offloaded_job(pool, 3, "ob-crash")
    await intake_all(store, leads("ob-crash"))
    made = await store.gather(Gathering("ob-crash", 100, 10_000_000, linger_s=0))
    states = [BatchState.RECORDED, BatchState.CREATING]
    # A lease long enough for a starved run; its expiry is played below.
    [taken] = [b for b in await store.claim("a", states, 30, 100) if b.id == made]
    assert taken.state is BatchState.RECORDED and taken.provider_id is None
    assert made not in [b.id for b in await store.claim("b", states, 30, 100)], "leased to a"
    await pool.execute("UPDATE offload_batches SET lease_until = now() WHERE id = $1", made)
    [resumed] = [b for b in await store.claim("b", states, 30, 100) if b.id == made]
    assert (resumed.rows, resumed.provider_id) == (3, None)
    assert not await store.set_submitted(made, "a", "batch_x"), "a lost its lease"
    assert await store.set_creating(made, "b", "file-1")
    assert await store.set_submitted(made, "b", "batch_b")
    record = await pool.fetchrow(
        "SELECT state, provider_id, input_file_id FROM offload_batches WHERE id = $1", made
    )
    assert tuple(record) == ("submitted", "batch_b", "file-1")
    assert not await store.others_hold("batch_b", made)


async def test_settle_forwards_rows_without_an_outcome_and_forward_publishes_them(
    pool: asyncpg.Pool,
) -> None:
    store = OffloadStore(pool)
    batch_id, workspace, made = await ended_provider_batch(store, pool, 5, "ob-settle", "o")
    assert not await store.all_rows_ended(made)
    assert await store.mark_rows([(batch_id, 0), (batch_id, 1)], RowState.DONE) == 2
    assert await store.mark_rows([(batch_id, 2)], RowState.FORWARD) == 1
    assert await store.settle(made, "o") == 2
    assert await row_states(pool, batch_id) == {"done": 2, "forward": 3}
    state = await pool.fetchval("SELECT state FROM offload_batches WHERE id = $1", made)
    assert state == "settled"

    published: list[ForwardRow] = []

    async def publish(rows: list[ForwardRow]) -> None:
        published.extend(r for r in rows if r.batch_id == batch_id)

    while await store.forward(100, 10_000_000, publish):
        pass
    assert [r.row_index for r in published] == [2, 3, 4]
    assert (published[0].model, published[0].params) == ("half", "{}")
    assert await row_states(pool, batch_id) == {"done": 2, "forwarded": 3}

    await JobStore(pool).cancel(workspace, batch_id)
    assert await store.all_rows_ended(made)
    await JobDeletion(pool).delete(workspace, batch_id)
    assert await row_states(pool, batch_id) == {}


async def test_a_failed_forward_publish_leaves_the_rows_to_forward(pool: asyncpg.Pool) -> None:
    store = OffloadStore(pool)
    batch_id, _ = await offloaded_job(pool, 2, "ob-refuse")
    await intake_all(store, {})

    async def refuse(rows: list[ForwardRow]) -> None:
        if any(r.batch_id == batch_id for r in rows):
            raise RuntimeError("broker away")

    with pytest.raises(RuntimeError, match="broker away"):
        while await store.forward(100, 10_000_000, refuse):
            pass
    assert await row_states(pool, batch_id) == {"forward": 2}


async def test_polls_back_off_without_progress_and_a_cancel_is_recorded(
    pool: asyncpg.Pool,
) -> None:
    store = OffloadStore(pool)
    await offloaded_job(pool, 2, "ob-poll")
    await intake_all(store, leads("ob-poll"))
    made = await store.gather(Gathering("ob-poll", 100, 10_000_000, linger_s=0))
    assert made is not None
    assert made in [b.id for b in await store.claim("p", [BatchState.RECORDED], 30, 100)]
    assert await store.set_submitted(made, "p", f"batch-poll-{made}")
    delays = [await store.polled(made, "p", 0, 1.0, 10.0) for _ in range(5)]
    assert delays == [2.0, 4.0, 8.0, 10.0, 10.0]
    assert await store.polled(made, "p", 1, 1.0, 10.0) == 1.0, "progress resets the backoff"
    assert await store.set_canceling(made, "p")
    state = await pool.fetchval("SELECT state FROM offload_batches WHERE id = $1", made)
    assert state == "canceling"


def dispatch_routes() -> AliasTable:
    """Alias ``half``: batch deployment ``ob-dispatch`` (24 h window, expected in 12 h),
    then a realtime one."""
    base = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}
    return parse_aliases(
        {
            "deployments": {
                "ob-dispatch": {"provider": "openai-batch", **base},
                "rt": {"provider": "openai", **base},
            },
            "aliases": {"half": {"deployments": ["ob-dispatch", "rt"]}},
        },
        {},
    )


async def test_a_dispatcher_offloads_a_patient_job_and_runs_a_hurried_one_realtime(
    pool: asyncpg.Pool,
) -> None:
    workspace = await KeyStore(pool).ensure_workspace(f"offd-{new_id()[:8]}")
    rows = [(f"c-{i}", request(i)) for i in range(6)]
    patient = await JobStore(pool).create(
        NewJob(new_id(), workspace, "p", "half", 0, 6, None, None, None), rows
    )
    hurried = await JobStore(pool).create(
        NewJob(
            new_id(),
            workspace,
            "h",
            "half",
            0,
            6,
            None,
            None,
            None,
            completion_window=timedelta(hours=1),
        ),
        rows,
    )
    published: list[SliceMessage] = []

    async def publish(task: SliceMessage, level: int) -> None:
        if task.batch_id in (patient.id, hurried.id):
            published.append(task)

    async def announce(event: JobEvent) -> None:
        raise AssertionError(f"unexpected job failure {event}")

    dispatcher = Dispatcher(
        DispatchStore(pool),
        publish,
        announce,
        lambda _: True,
        DispatchConfig("dispatcher-offload-int", 100, 4, 1000, lease_s=30),
        plan_lanes=LanePlanner(pool, dispatch_routes()),
    )
    await dispatcher.claim()
    await dispatcher.hand_back()  # jobs of other tests it may have claimed go back
    record = await pool.fetchrow(
        "SELECT offload_deployment, dispatched_upto, lease_expires_at FROM batches WHERE id = $1",
        patient.id,
    )
    assert tuple(record) == ("ob-dispatch", 6, None)
    assert {t.batch_id for t in published} == {hurried.id}
    assert sorted(r.index for t in published for r in t.rows) == list(range(6))
    assert (
        await pool.fetchval("SELECT offload_deployment FROM batches WHERE id = $1", hurried.id)
        is None
    )


async def set_request(pool: asyncpg.Pool, batch_id: str, row_index: int, text: str) -> None:
    """Store ``text`` as the row's request, with the model the ledger reads from it."""
    await pool.execute(
        "UPDATE batch_rows SET request = $3, model = $4 WHERE row_index = $2"
        " AND batch_id = (SELECT rows_batch_id FROM batches WHERE id = $1)",
        batch_id,
        row_index,
        text,
        row_model(text),
    )


async def test_intake_reads_a_row_holding_a_nul_and_an_unreadable_row_blocks_no_job(
    pool: asyncpg.Pool,
) -> None:
    store = OffloadStore(pool)
    nul, _ = await offloaded_job(pool, 3, "ob-nul", models={2: "realtime-only"})
    nul_text = orjson.dumps({"messages": [{"role": "user", "content": "a\x00b"}]}).decode()
    assert "\\u0000" in nul_text
    await set_request(pool, nul, 0, nul_text)
    model_nul = orjson.dumps({"messages": [], "model": "half\x00"}).decode()
    await set_request(pool, nul, 1, model_nul)
    broken, _ = await offloaded_job(pool, 2, "ob-nul", models={1: "other-half"})
    await set_request(pool, broken, 0, '{"messages": [], "model": "half"')
    fine, _ = await offloaded_job(pool, 2, "ob-nul")
    await intake_all(store, leads("ob-nul"))
    # A NUL in a model is no alias: that row goes realtime like any unknown alias.
    assert await pool.fetch(
        "SELECT row_index, state FROM offload_rows WHERE batch_id = $1 ORDER BY row_index", nul
    ) == [(0, "pending"), (1, "forward"), (2, "forward")]
    # Unread: that row goes realtime (the router fails it there); the intake reads no
    # request, so its job's other row is offloaded as any other.
    assert await pool.fetch(
        "SELECT row_index, state FROM offload_rows WHERE batch_id = $1 ORDER BY row_index", broken
    ) == [(0, "forward"), (1, "pending")]
    assert await row_states(pool, fine) == {"pending": 2}


async def test_intake_routes_each_row_by_its_stored_model_column(pool: asyncpg.Pool) -> None:
    store = OffloadStore(pool)
    batch_id, _ = await offloaded_job(
        pool, 4, "ob-column", models={1: "other-half", 2: "realtime-only"}
    )
    stored = await pool.fetch(
        "SELECT r.model FROM batch_rows r JOIN batches b ON r.batch_id = b.rows_batch_id"
        " WHERE b.id = $1 ORDER BY r.row_index",
        batch_id,
    )
    assert [r[0] for r in stored] == [None, "other-half", "realtime-only", None]
    # The column decides, not the request: row 0 (a bare array) names realtime-only
    # there, row 2 (whose request names realtime-only) names none.
    await pool.execute(
        "UPDATE batch_rows SET model = CASE row_index WHEN 0 THEN 'realtime-only' END"
        " WHERE row_index IN (0, 2)"
        " AND batch_id = (SELECT rows_batch_id FROM batches WHERE id = $1)",
        batch_id,
    )
    await intake_all(store, leads("ob-column"))
    assert await pool.fetch(
        "SELECT row_index, state FROM offload_rows WHERE batch_id = $1 ORDER BY row_index",
        batch_id,
    ) == [(0, "forward"), (1, "pending"), (2, "pending"), (3, "pending")]


async def taken_in(store: OffloadStore, pool: asyncpg.Pool, total: int, deployment: str) -> str:
    """An offloaded job of ``total`` rows taken in under ``deployment``: its id."""
    batch_id, _ = await offloaded_job(pool, total, deployment)
    await intake_all(store, leads(deployment))
    return batch_id


async def test_gather_never_submits_a_row_a_concurrent_drop_holds(pool: asyncpg.Pool) -> None:
    store = OffloadStore(pool)
    batch_id = await taken_in(store, pool, 3, "ob-race")
    async with pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        await conn.execute(
            "UPDATE offload_rows SET state = 'dropped' WHERE batch_id = $1 AND row_index = 0",
            batch_id,
        )
        gather = asyncio.create_task(store.gather(Gathering("ob-race", 100, 10_000_000, 0)))
        for _ in range(200):  # until the gather is done or waits on the dropped row
            waiting = await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%INSERT INTO offload_batches%'"
            )
            if gather.done() or waiting:
                break
            await asyncio.sleep(0.025)
        await transaction.commit()
        made = await gather
    assert made is not None
    states = await pool.fetch(
        "SELECT row_index, state FROM offload_rows WHERE batch_id = $1 ORDER BY row_index",
        batch_id,
    )
    assert [tuple(r) for r in states] == [(0, "dropped"), (1, "submitted"), (2, "submitted")]


async def test_gather_sends_a_job_whose_deadline_came_too_near_realtime(
    pool: asyncpg.Pool,
) -> None:
    store = OffloadStore(pool)
    late, _ = await offloaded_job(pool, 3, "ob-late")
    patient, _ = await offloaded_job(pool, 2, "ob-late")
    far, _ = await offloaded_job(pool, 2, "ob-late")
    await intake_all(store, leads("ob-late"))
    # Paused for hours, then resumed: 2 h left, less than a 24 h window and the margin.
    await pool.execute(
        "UPDATE batches SET expires_at = now() + interval '2 hours' WHERE id = $1", late
    )
    await pool.execute(
        "UPDATE batches SET expires_at = now() + interval '26 hours' WHERE id = $1", far
    )
    gathering = Gathering("ob-late", 100, 10_000_000, linger_s=0, window_s=86_400)
    made = await store.gather(gathering)
    assert made is not None
    assert await row_states(pool, late) == {"forward": 3}
    assert await row_states(pool, patient) == {"submitted": 2}
    assert await row_states(pool, far) == {"submitted": 2}
    rows = await pool.fetchval("SELECT rows FROM offload_batches WHERE id = $1", made)
    assert rows == 4


async def test_intake_forwards_pending_rows_of_a_deployment_gone_from_the_routes(
    pool: asyncpg.Pool,
) -> None:
    store = OffloadStore(pool)
    gone, _ = await offloaded_job(pool, 5, "ob-left")
    await intake_all(store, {"half": "ob-left"})
    kept, _ = await offloaded_job(pool, 2, "ob-kept")
    await intake_all(store, {"half": "ob-kept"})
    assert await row_states(pool, gone) == {"pending": 5}
    # The routes file changed: ob-left is no batch deployment any more (the other
    # tests' deployments still are).
    held = await pool.fetch("SELECT DISTINCT deployment FROM offload_rows WHERE state = 'pending'")
    routed = [r[0] for r in held if r[0] != "ob-left"] + ["ob-other"]
    assert await store.intake({"half": "ob-kept"}, step=3, routed=routed) == 3
    assert (await row_states(pool, gone)).get("forward") == 3, "bounded steps"
    await intake_all(store, {"half": "ob-kept"}, step=3, routed=routed)
    assert await row_states(pool, gone) == {"forward": 5}
    assert await row_states(pool, kept) == {"pending": 2}


async def forward_all(store: OffloadStore, batch_ids: set[str]) -> list[ForwardRow]:
    published: list[ForwardRow] = []

    async def publish(rows: list[ForwardRow]) -> None:
        published.extend(r for r in rows if r.batch_id in batch_ids)

    while await store.forward(100, 10_000_000, publish):
        pass
    return published


async def test_forward_holds_a_paused_jobs_rows_until_it_runs_and_drops_an_ended_jobs(
    pool: asyncpg.Pool,
) -> None:
    store = OffloadStore(pool)
    paused, paused_workspace = await offloaded_job(pool, 3, "ob-fwd-hold")
    ended, ended_workspace = await offloaded_job(pool, 2, "ob-fwd-hold")
    await intake_all(store, {})
    await JobStore(pool).pause(paused_workspace, paused)
    await JobStore(pool).cancel(ended_workspace, ended)
    assert await forward_all(store, {paused, ended}) == []
    assert await row_states(pool, paused) == {"forward": 3}
    await JobStore(pool).resume(paused_workspace, paused)
    assert await forward_all(store, {paused}) == [], "queued: not running yet"
    await pool.execute("UPDATE batches SET status = 'running' WHERE id = $1", paused)
    assert [r.row_index for r in await forward_all(store, {paused})] == [0, 1, 2]
    assert await row_states(pool, paused) == {"forwarded": 3}
    assert await store.drop_ended() >= 2
    assert await row_states(pool, ended) == {"dropped": 2}


async def test_rows_a_provider_batch_did_not_answer_are_dropped_when_their_job_ended(
    pool: asyncpg.Pool,
) -> None:
    store = OffloadStore(pool)
    batch_id, workspace, made = await ended_provider_batch(store, pool, 4, "ob-fwd-ended", "e")
    await JobStore(pool).cancel(workspace, batch_id)
    assert await store.mark_rows([(batch_id, 0)], RowState.DONE) == 1
    assert await store.mark_rows([(batch_id, 1)], RowState.FORWARD) == 1
    assert await store.settle(made, "e") == 2
    assert await row_states(pool, batch_id) == {"done": 1, "dropped": 3}


async def test_the_drop_of_an_ended_jobs_rows_goes_in_bounded_steps(pool: asyncpg.Pool) -> None:
    store = OffloadStore(pool)
    batch_id = await taken_in(store, pool, 5, "ob-drop-steps")
    await store.drop_ended()  # what other tests left
    await pool.execute(
        "UPDATE batches SET status = 'canceled', completed_at = now() WHERE id = $1", batch_id
    )
    assert await store.drop_ended(step=2, rounds=1) == 2
    assert await row_states(pool, batch_id) == {"dropped": 2, "pending": 3}
    assert await store.drop_ended(step=2) == 3, "steps until fewer than a step were left"
    assert await row_states(pool, batch_id) == {"dropped": 5}


async def test_an_offloaded_job_holds_no_place_under_the_workspace_running_cap(
    pool: asyncpg.Pool,
) -> None:
    offloaded, workspace = await offloaded_job(pool, 2, "ob-cap")
    await DispatchStore(pool).release(OWNER, [offloaded])
    waiting = await JobStore(pool).create(
        NewJob(new_id(), workspace, "rt", "half", 0, 1, None, None, None), [("c-0", request(0))]
    )
    async with pool.acquire() as conn:
        transaction = conn.transaction()
        await transaction.start()
        try:  # what a claim capped at 1 running job a workspace takes, undone
            queued = await conn.fetch(
                dispatch._CLAIM_QUEUED, "cap-dispatcher", 100_000, 30, "running", 1, [], []
            )
        finally:
            await transaction.rollback()
    assert waiting.id in [r["id"] for r in queued]
    outranking = await DispatchStore(pool).claim_outranking(
        "cap-dispatcher", {workspace: -1000}, 10, 30, per_workspace=1
    )
    assert [j.id for j in outranking] == [waiting.id]


async def test_a_large_intake_reads_the_tables_statistics_again(pool: asyncpg.Pool) -> None:
    """Statistics taken while offload_rows held a few finished rows say nothing is
    pending; a gather of 20,000 rows planned on them took minutes (a nested loop).
    An intake of ANALYZE_AFTER_ROWS rows or more analyzes the table itself."""
    store = OffloadStore(pool)
    await offloaded_job(pool, ANALYZE_AFTER_ROWS, "stats-dep")

    async def analyzed() -> int:
        count = await pool.fetchval(
            "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'offload_rows'"
        )
        return int(count or 0)

    before = await analyzed()
    await intake_all(store, leads("stats-dep"))
    # The statistics collector reports a little after the fact.
    for _ in range(100):
        if await analyzed() > before:
            break
        await asyncio.sleep(0.1)
    assert await analyzed() > before
