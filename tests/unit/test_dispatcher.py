"""Unit tests of the dispatcher's windowed release of rows, on an in-memory store."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import cast

import pytest

from relay_batches.bus.topology import EVENT_CANCELED, Names
from relay_batches.kit.base import ServiceBus
from relay_batches.kit.consumer import Subscribe
from relay_batches.ledger.dispatch import RunningJob
from relay_batches.messages import JobEvent, SliceMessage, SliceRow
from relay_batches.metrics import JOB_TRANSITIONS
from relay_batches.model import JobStatus
from relay_batches.services.dispatcher.core import (
    FETCH_SLICES,
    DispatchConfig,
    Dispatcher,
    byte_window_end,
)
from relay_batches.services.dispatcher.service import dispatcher_service
from tests.helpers.fakes import (
    LEASE_S,
    OWNER,
    FakeDispatchStore,
    Recorder,
    job,
    messages_json,
)


def make_dispatcher(
    store: FakeDispatchStore,
    recorder: Recorder,
    *,
    window: int = 20,
    slice_rows: int = 4,
    max_running_jobs: int = 8,
    known: frozenset[str] = frozenset({"gpt-4o-mini"}),
) -> Dispatcher:
    config = DispatchConfig(OWNER, window, slice_rows, max_running_jobs, LEASE_S)
    return Dispatcher(store, recorder.publish, recorder.announce, known.__contains__, config)


def progress(
    batch_id: str, completed: int, failed: int = 0, status: str = "running", total: int = 100
) -> JobEvent:
    return JobEvent(batch_id, status, total, completed, failed)


def slices(start: int, end: int, size: int) -> list[list[int]]:
    return [list(range(i, min(i + size, end))) for i in range(start, end, size)]


async def test_claim_publishes_one_window_in_consecutive_slices(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job(total=100, priority=7))
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    assert await dispatcher.claim() == 1
    assert recorder.indexes() == slices(0, 20, 4)
    # The job's priority orders it within its workspace only: its rows go at level 0.
    assert all(level == 0 for _, level in recorder.tasks)
    first, _ = recorder.tasks[0]
    assert first == SliceMessage(
        "job1",
        "gpt-4o-mini",
        tuple(SliceRow(i, messages_json(i)) for i in range(4)),
        '{"temperature":0}',
        0,
        first.sent_at,
        OWNER,
        workspace="ws-job1",
    )
    assert first.sent_at > 0, "stamped with the time it went out, on our own clock"
    assert store.advanced == [("job1", 20)]
    assert dispatcher.jobs["job1"].dispatched_upto == 20


async def test_window_not_a_multiple_of_slice_publishes_whole_slices_only(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job(total=100))
    dispatcher = make_dispatcher(store, recorder, window=10, slice_rows=4)
    await dispatcher.claim()
    assert recorder.indexes() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert dispatcher.jobs["job1"].dispatched_upto == 8


async def test_on_progress_tops_up_exactly_to_the_window(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job(total=100))
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    await dispatcher.claim()
    recorder.tasks.clear()

    await dispatcher.on_progress(progress("job1", completed=6, failed=2))
    assert recorder.indexes() == slices(20, 28, 4)
    assert dispatcher.jobs["job1"].dispatched_upto == 28  # done (8) + window (20)

    recorder.tasks.clear()
    await dispatcher.on_progress(progress("job1", completed=9, failed=2))  # done 11
    # Only 3 rows of room: less than a slice, nothing goes out yet.
    assert recorder.tasks == []
    await dispatcher.on_progress(progress("job1", completed=10, failed=2))  # done 12
    # 4 rows of room: a slice, but less than a quarter window (5): still nothing.
    assert recorder.tasks == []
    await dispatcher.on_progress(progress("job1", completed=11, failed=2))  # done 13
    assert recorder.indexes() == [[28, 29, 30, 31]]
    assert dispatcher.jobs["job1"].dispatched_upto == 32
    assert store.advanced == [("job1", 20), ("job1", 28), ("job1", 32)]


async def test_stale_progress_never_moves_done_back(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job(total=100))
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    await dispatcher.claim()
    await dispatcher.on_progress(progress("job1", completed=8))
    recorder.tasks.clear()
    await dispatcher.on_progress(progress("job1", completed=2))
    assert recorder.tasks == []
    assert dispatcher.jobs["job1"].done == 8


async def test_progress_of_an_unknown_job_is_ignored(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    dispatcher = make_dispatcher(store, recorder)
    await dispatcher.on_progress(progress("other", completed=5))
    assert recorder.tasks == []
    assert store.fetches == []


async def test_resume_from_dispatched_upto(store: FakeDispatchStore, recorder: Recorder) -> None:
    store.expired.append(job(total=100, completed=30, failed=2, dispatched_upto=40))
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    assert await dispatcher.claim() == 1
    # done 32 + window 20 = 52: rows 40..51, nothing before 40.
    assert recorder.indexes() == slices(40, 52, 4)
    assert store.fetches == [("rows-job1", 40, 52)]
    assert store.advanced == [("job1", 52)]


async def test_unknown_model_fails_the_job(store: FakeDispatchStore, recorder: Recorder) -> None:
    store.queued.append(job(model="mystery", total=12, completed=0, failed=0))
    dispatcher = make_dispatcher(store, recorder)
    assert await dispatcher.claim() == 1
    assert store.failed == [("job1", "model alias 'mystery' is not in the routes file")]
    assert recorder.events == [JobEvent("job1", "failed", 12, 0, 0)]
    assert recorder.tasks == []
    assert store.fetches == []
    assert dispatcher.jobs == {}


@pytest.mark.parametrize("status", ["completed", "failed", "canceled", "expired"])
async def test_terminal_progress_forgets_the_job(
    store: FakeDispatchStore, recorder: Recorder, status: str
) -> None:
    store.queued.append(job(total=100))
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    await dispatcher.claim()
    recorder.tasks.clear()
    await dispatcher.on_progress(progress("job1", completed=20, status=status))
    assert "job1" not in dispatcher.jobs
    assert recorder.tasks == []
    await dispatcher.on_progress(progress("job1", completed=20))
    assert recorder.tasks == []


async def test_terminal_progress_gives_no_lease_back(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job(total=100))
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    await dispatcher.claim()
    await dispatcher.on_progress(progress("job1", completed=100, status="completed"))
    assert store.released == []


@pytest.mark.parametrize("status", ["paused", "queued"])
async def test_progress_of_a_job_no_longer_running_forgets_it_and_gives_its_lease_back(
    store: FakeDispatchStore, recorder: Recorder, status: str
) -> None:
    store.queued.append(job(total=100))
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    await dispatcher.claim()
    recorder.tasks.clear()

    await dispatcher.on_progress(progress("job1", completed=20, status=status))

    assert "job1" not in dispatcher.jobs
    assert recorder.tasks == []  # the freed window is not topped up
    # A no-op on a paused job; a running one (the event older than a resume we claimed
    # it after) is claimed again at the next pass instead of a lease later.
    assert store.released == [["job1"]]
    await dispatcher.on_progress(progress("job1", completed=30))
    assert recorder.tasks == []


async def test_a_pause_tops_up_the_jobs_it_kept_parked_at_once(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued += [
        job("high", total=40, priority=5, workspace="a"),
        job("low", total=40, priority=1, workspace="a"),
    ]
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    await dispatcher.claim()
    assert recorder.flat("low") == []
    await dispatcher.on_progress(progress("high", completed=3, status="paused", total=40))
    assert "high" not in dispatcher.jobs
    assert recorder.flat("low") == list(range(20))


async def test_renew_drops_jobs_the_store_no_longer_returns(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued += [job("keep", total=100), job("lose", total=100)]
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    await dispatcher.claim()
    recorder.tasks.clear()
    del store.alive["lose"]
    store.alive["keep"] = replace(store.alive["keep"], completed=5)

    await dispatcher.renew()

    assert set(dispatcher.jobs) == {"keep"}
    assert ("renew", OWNER, ["keep", "lose"], LEASE_S) in store.calls
    # The surviving job's counters were refreshed and its window topped up.
    assert recorder.indexes() == [[20, 21, 22, 23]]
    assert {task.batch_id for task, _ in recorder.tasks} == {"keep"}


async def test_renew_without_jobs_does_not_touch_the_store(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    dispatcher = make_dispatcher(store, recorder)
    await dispatcher.renew()
    assert store.calls == []


@pytest.mark.parametrize(
    ("total", "window", "slice_rows"),
    [(10, 100, 4), (10, 4, 4), (7, 3, 2), (13, 5, 5), (5, 1, 1), (3, 100, 16)],
)
async def test_short_last_slice_and_no_index_past_total(
    store: FakeDispatchStore, recorder: Recorder, total: int, window: int, slice_rows: int
) -> None:
    store.queued.append(job(total=total))
    dispatcher = make_dispatcher(store, recorder, window=window, slice_rows=slice_rows)
    await dispatcher.claim()
    done = 0
    while "job1" in dispatcher.jobs and not dispatcher.jobs["job1"].exhausted:
        done = dispatcher.jobs["job1"].dispatched_upto  # every published row finished
        await dispatcher.on_progress(progress("job1", completed=done, total=total))
    assert recorder.flat() == list(range(total))
    assert recorder.indexes() == slices(0, total, slice_rows)
    assert all(len(part) <= slice_rows for part in recorder.indexes())
    assert max(recorder.flat()) == total - 1
    assert store.advanced[-1] == ("job1", total)


async def test_fetches_are_bounded_to_a_few_slices(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job(total=200))
    dispatcher = make_dispatcher(store, recorder, window=1000, slice_rows=4)
    await dispatcher.claim()
    step = 4 * FETCH_SLICES
    assert store.fetches == [
        ("rows-job1", start, min(200, start + step)) for start in range(0, 200, step)
    ]
    assert recorder.flat() == list(range(200))
    assert dispatcher.jobs["job1"].exhausted


async def test_a_release_is_recorded_in_the_ledger_before_any_of_its_rows_is_published(
    store: FakeDispatchStore,
) -> None:
    recorded_when_published: list[tuple[int, int]] = []  # (slice's end, dispatched_upto then)

    async def publish(task: SliceMessage, level: int) -> None:
        upto = max((u for b, u in store.advanced if b == task.batch_id), default=0)
        recorded_when_published.append((task.rows[-1].index + 1, upto))

    config = DispatchConfig(OWNER, 40, 4, 8, LEASE_S)
    dispatcher = Dispatcher(store, publish, Recorder().announce, lambda _: True, config)
    store.queued.append(job(total=100))
    await dispatcher.claim()
    await dispatcher.on_progress(progress("job1", completed=20))
    assert store.advanced == [("job1", 40), ("job1", 60)]
    assert [end for end, _ in recorded_when_published] == list(range(4, 61, 4))
    assert all(end <= upto for end, upto in recorded_when_published)


async def test_a_refused_advance_publishes_nothing_and_forgets_the_job(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    """A job paused, canceled or taken over while we release: the ledger refuses the
    release, so none of its rows goes out (they are released once, on resume)."""
    store.queued.append(job(total=200))
    store.lost.add("job1")
    dispatcher = make_dispatcher(store, recorder, window=1000, slice_rows=4)
    await dispatcher.claim()
    assert store.advanced == [("job1", 4 * FETCH_SLICES)]
    assert recorder.tasks == []
    assert dispatcher.jobs == {}


def stopped(running: RunningJob) -> RunningJob:
    """``running`` as the ledger returns it once its budget stopped it."""
    return replace(running, budget_exceeded_at=datetime(2026, 10, 4, 9, 13, tzinfo=UTC))


async def test_a_job_its_budget_stopped_releases_no_more_rows_but_stays_ours(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job(total=100))
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    await dispatcher.claim()
    recorder.tasks.clear()
    store.alive["job1"] = stopped(replace(store.alive["job1"], completed=8))
    await dispatcher.renew()  # learns of the stop: releases nothing, not even a try
    await dispatcher.on_progress(progress("job1", completed=16))
    assert recorder.tasks == []
    assert store.advanced == [("job1", 20)]
    assert set(dispatcher.jobs) == {"job1"}, "kept: its rows in flight may need re-sending"
    assert dispatcher.jobs["job1"].exhausted


async def test_a_release_the_budget_stop_refuses_publishes_nothing(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job(total=100))
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    await dispatcher.claim()
    recorder.tasks.clear()
    store.alive["job1"] = stopped(store.alive["job1"])  # stopped, we do not know it yet
    await dispatcher.on_progress(progress("job1", completed=8))
    assert store.advanced == [("job1", 20), ("job1", 28)]
    assert recorder.tasks == []


async def test_a_job_adopted_after_its_budget_stopped_releases_nothing_and_parks_no_job(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.expired.append(
        stopped(job("spent", total=100, priority=9, dispatched_upto=30, workspace="a"))
    )
    store.queued.append(job("low", total=40, priority=1, workspace="a"))
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    await dispatcher.claim()
    assert set(dispatcher.jobs) == {"spent", "low"}
    assert recorder.flat("spent") == []
    assert ("spent", 30) not in store.advanced and all(b != "spent" for b, _ in store.advanced)
    assert recorder.flat("low") == list(range(20)), "a stopped job holds nothing back"


async def test_claim_prefers_expired_then_queued_up_to_the_limit(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.expired.append(job("orphan", priority=1, total=4))
    store.queued += [job("low", priority=2, total=4), job("high", priority=9, total=4)]
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4, max_running_jobs=2)
    assert await dispatcher.claim() == 2
    floors = {"ws-orphan": 1, "ws-high": 9}
    assert store.calls == [
        ("claim_expired", OWNER, 2, LEASE_S),
        ("claim_queued", OWNER, 1, LEASE_S),
        ("claim_outranking", OWNER, floors, 2),
    ]
    # Adopted highest priority first.
    assert [task.batch_id for task, _ in recorder.tasks] == ["high", "orphan"]
    store.calls.clear()
    # Full: only a job outranking its workspace's jobs here could still be claimed.
    assert await dispatcher.claim() == 0
    assert store.calls == [("claim_outranking", OWNER, floors, 2)]


async def test_release_all_gives_up_every_lease(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued += [job("a"), job("b")]
    dispatcher = make_dispatcher(store, recorder)
    await dispatcher.claim()
    await dispatcher.release_all()
    assert store.released == [["a", "b"]]
    assert dispatcher.jobs == {}


async def test_window_smaller_than_a_slice_still_releases_one_slice(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job(total=10))
    dispatcher = make_dispatcher(store, recorder, window=3, slice_rows=4)
    await dispatcher.claim()
    assert recorder.indexes() == [[0, 1, 2, 3]]
    await dispatcher.on_progress(progress("job1", completed=4, total=10))
    await dispatcher.on_progress(progress("job1", completed=8, total=10))
    assert recorder.indexes() == slices(0, 10, 4)
    assert dispatcher.jobs["job1"].exhausted


# --- crash recovery: takeover and stalls -----------------------------------------------


async def test_takeover_resumes_at_dispatched_upto_and_skips_rows_with_an_outcome(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.expired.append(job(total=100, completed=30, dispatched_upto=40))
    store.outcomes["job1"] = set(range(30)) | {40, 41}
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    assert await dispatcher.claim() == 1
    assert recorder.flat() == list(range(42, 48))
    assert store.advanced == [("job1", 48)]


async def test_concurrent_claims_never_exceed_the_running_limit(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued += [job(f"job{i}", total=8) for i in range(10)]
    dispatcher = make_dispatcher(store, recorder, max_running_jobs=3)
    await asyncio.gather(*(dispatcher.claim() for _ in range(5)))
    assert len(dispatcher.jobs) == 3


def test_slices_are_cut_by_rows_and_by_bytes() -> None:
    from relay_batches.services.dispatcher.core import slice_rows

    rows = [(i, "x" * size) for i, size in enumerate([10, 10, 10, 50, 10, 10])]
    assert [[i for i, _ in part] for part in slice_rows(rows, 4, 1000)] == [[0, 1, 2, 3], [4, 5]]
    assert [[i for i, _ in part] for part in slice_rows(rows, 4, 35)] == [
        [0, 1, 2],
        [3],
        [4, 5],
    ]


# --- sharing: one window per workspace, priority within it -----------------------------


async def test_jobs_of_one_workspace_share_its_window_and_another_workspace_has_its_own(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued += [job("a1", total=100, workspace="a"), job("b1", total=100, workspace="b")]
    dispatcher = make_dispatcher(store, recorder, window=16, slice_rows=4)
    await dispatcher.claim()
    store.queued.append(job("a2", total=100, workspace="a"))
    await dispatcher.claim()
    published = {i: len(recorder.flat(i)) for i in ("a1", "a2", "b1")}
    assert published == {"a1": 16, "a2": 8, "b1": 16}  # a1 alone at first, then halves
    # a1 has more than its half queued: it waits until it drained below 8.
    recorder.tasks.clear()
    await dispatcher.on_progress(progress("a1", completed=4))
    assert recorder.flat("a1") == []
    await dispatcher.on_progress(progress("a1", completed=12))
    assert recorder.flat("a1") == [16, 17, 18, 19]
    assert dispatcher.jobs["a1"].in_flight == 8


async def test_jobs_claimed_together_are_released_under_the_parts_they_share(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    """Every job of one claim is taken in before any is topped up: the first is not
    released under a window the others would then have shrunk."""
    store.queued += [
        job("a1", total=100, workspace="a"),
        job("a2", total=100, workspace="a"),
        job("b1", total=100, workspace="b"),
    ]
    dispatcher = make_dispatcher(store, recorder, window=16, slice_rows=4)
    await dispatcher.claim()
    published = {i: len(recorder.flat(i)) for i in ("a1", "a2", "b1")}
    assert published == {"a1": 8, "a2": 8, "b1": 16}


async def test_a_higher_priority_job_is_claimed_with_the_slots_full_and_the_lower_waits(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job("low", total=100, priority=0, workspace="a"))
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4, max_running_jobs=1)
    await dispatcher.claim()
    assert recorder.flat("low") == list(range(20))
    recorder.tasks.clear()

    store.queued.append(job("high", total=40, priority=100, workspace="a"))
    assert await dispatcher.claim() == 1
    assert set(dispatcher.jobs) == {"low", "high"}
    # One level above the 20 low rows still queued, for as many rows; then level 0.
    assert [(t.batch_id, level) for t, level in recorder.tasks] == [("high", 1)] * 5
    await dispatcher.on_progress(progress("low", completed=20))
    assert recorder.flat("low") == []  # held: its lease is kept, no top-up
    assert dispatcher.jobs["low"].held
    recorder.tasks.clear()
    await dispatcher.on_progress(progress("high", completed=20, total=40))
    high = [(t.batch_id, level) for t, level in recorder.tasks if t.batch_id == "high"]
    assert high == [("high", 0)] * 5
    assert dispatcher.jobs["high"].exhausted
    # Every row of the high job is out: the low one is topped up again at once.
    assert recorder.flat("low") == list(range(20, 40))
    assert not dispatcher.jobs["low"].held


async def test_a_lower_priority_job_waits_while_a_higher_one_of_its_workspace_releases(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued += [
        job("high", total=40, priority=5, workspace="a"),
        job("low", total=40, priority=1, workspace="a"),
        job("other", total=40, priority=0, workspace="b"),
    ]
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    await dispatcher.claim()
    assert (len(recorder.flat("high")), recorder.flat("low"), len(recorder.flat("other"))) == (
        20,
        [],
        20,
    )
    await dispatcher.on_progress(progress("high", completed=20, total=40))
    assert recorder.flat("low") == list(range(20))
    await dispatcher.on_progress(progress("high", completed=40, status="completed", total=40))
    assert "high" not in dispatcher.jobs


async def test_no_outranking_claim_while_slots_are_free(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job("a", total=8))
    dispatcher = make_dispatcher(store, recorder, max_running_jobs=2)
    await dispatcher.claim()
    assert [c[0] for c in store.calls] == ["claim_expired", "claim_queued"]


async def test_outranking_claims_stop_at_twice_the_slots(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job("p0", total=100, priority=0, workspace="a"))
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4, max_running_jobs=1)
    await dispatcher.claim()
    store.queued.append(job("p1", total=100, priority=1, workspace="a"))
    await dispatcher.claim()
    store.queued.append(job("p2", total=100, priority=2, workspace="a"))
    store.calls.clear()
    assert await dispatcher.claim() == 0
    assert store.calls == []
    assert set(dispatcher.jobs) == {"p0", "p1"}
    assert [dispatcher.jobs[i].held for i in ("p0", "p1")] == [True, False]


# --- the byte window ---------------------------------------------------------------------

KB = 1000


def test_byte_window_end_stops_before_the_row_that_would_overflow() -> None:
    rows = [(10, 3 * KB), (11, 3 * KB), (12, 3 * KB)]
    assert byte_window_end(0, rows, 10, 13, 10 * KB) == 13  # 9 KB fit
    assert byte_window_end(0, rows, 10, 13, 8 * KB) == 12
    assert byte_window_end(2 * KB, rows, 10, 13, 8 * KB) == 12  # 2 + 3 + 3
    assert byte_window_end(3 * KB, rows, 10, 13, 8 * KB) == 11


def test_byte_window_end_waits_until_a_quarter_of_the_window_is_free() -> None:
    rows = [(5, 100)]
    assert byte_window_end(7 * KB, rows, 5, 6, 8 * KB) == 5  # 1 KB free of 8: wait
    assert byte_window_end(6 * KB, rows, 5, 6, 8 * KB) == 6  # 2 KB free: go


def test_a_row_larger_than_the_byte_window_goes_alone_when_nothing_is_in_flight() -> None:
    rows = [(0, 50 * KB), (1, 1 * KB)]
    assert byte_window_end(0, rows, 0, 2, 8 * KB) == 1
    assert byte_window_end(1, rows, 0, 2, 8 * KB) == 0  # something is out: it waits
    assert byte_window_end(0, [], 4, 8, 8 * KB) == 8  # rows with outcomes only: move on


def bytes_dispatcher(store: FakeDispatchStore, recorder: Recorder, window_bytes: int) -> Dispatcher:
    config = DispatchConfig(OWNER, 20, 4, 8, LEASE_S, window_bytes=window_bytes)
    return Dispatcher(store, recorder.publish, recorder.announce, lambda _: True, config)


def in_flight_bytes(store: FakeDispatchStore, recorder: Recorder) -> int:
    done = store.outcomes.get("job1", set())
    return sum(store.size(i) for i in recorder.flat("job1") if i not in done)


async def test_big_rows_are_released_within_the_byte_window(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job(total=12))
    store.row_bytes.update(dict.fromkeys(range(12), 3 * KB))
    store.row_bytes[9] = 30 * KB
    dispatcher = bytes_dispatcher(store, recorder, window_bytes=10 * KB)

    async def finish(upto: int) -> None:
        store.outcomes["job1"] = set(range(upto))
        await dispatcher.on_progress(progress("job1", completed=upto, total=12))

    await dispatcher.claim()
    # The row window (20) would take all 12 rows; 10 KB take three.
    assert recorder.indexes() == [[0, 1, 2]]
    await finish(1)  # 6 KB out, 4 KB free: row 3 fits, row 4 would not
    assert recorder.indexes()[1:] == [[3]]
    await finish(3)  # 3 KB out: rows 4 and 5
    assert recorder.indexes()[2:] == [[4, 5]]
    assert in_flight_bytes(store, recorder) == 9 * KB
    await finish(6)  # nothing out: rows 6..8; row 9 (30 KB) waits
    assert recorder.indexes()[3:] == [[6, 7, 8]]
    await finish(9)  # row 9 goes alone, larger than the window
    assert recorder.indexes()[4:] == [[9]]
    await finish(10)
    assert recorder.indexes()[5:] == [[10, 11]]
    assert dispatcher.jobs["job1"].settled_below == 10
    assert store.advanced == [("job1", n) for n in (3, 4, 6, 9, 10, 12)]


async def test_jobs_of_one_workspace_share_its_byte_window_and_another_has_its_own(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued += [job("a1", total=12, workspace="a"), job("b1", total=12, workspace="b")]
    store.row_bytes.update(dict.fromkeys(range(12), 3 * KB))
    dispatcher = bytes_dispatcher(store, recorder, window_bytes=12 * KB)
    await dispatcher.claim()
    store.queued.append(job("a2", total=12, workspace="a"))
    await dispatcher.claim()
    # a1 alone at first (12 KB: four rows), then a1 and a2 split A's 12 KB; B has its own.
    published = {i: len(recorder.flat(i)) for i in ("a1", "a2", "b1")}
    assert published == {"a1": 4, "a2": 2, "b1": 4}
    recorder.tasks.clear()
    store.outcomes["a2"] = {0, 1}
    await dispatcher.on_progress(progress("a2", completed=2, total=12))
    assert recorder.flat("a2") == [2, 3], "6 KB, a2's half of its workspace's window"
    store.outcomes["a1"] = {0, 1}
    await dispatcher.on_progress(progress("a1", completed=2, total=12))
    assert recorder.flat("a1") == [], "a1 still has its 6 KB in flight"


async def test_a_spent_boost_does_not_raise_the_level_of_the_next_job_that_overtakes(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job("p0", total=100, priority=0, workspace="a"))
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4, max_running_jobs=4)
    await dispatcher.claim()
    store.queued.append(job("p1", total=100, priority=1, workspace="a"))
    await dispatcher.claim()
    assert {level for t, level in recorder.tasks if t.batch_id == "p1"} == {1}
    assert dispatcher.jobs["p1"].boost <= 0  # spent: its next rows go at level 0
    store.queued.append(job("p2", total=100, priority=2, workspace="a"))
    await dispatcher.claim()
    # One above the current levels of the jobs it overtakes (0 and 0), never climbing.
    assert {level for t, level in recorder.tasks if t.batch_id == "p2"} == {1}


async def test_a_cancel_tops_up_the_jobs_it_kept_parked_at_once(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued += [
        job("high", total=40, priority=5, workspace="a"),
        job("low", total=40, priority=1, workspace="a"),
    ]
    dispatcher = make_dispatcher(store, recorder, window=20, slice_rows=4)
    await dispatcher.claim()
    assert recorder.flat("low") == []
    bus = cast(ServiceBus, SimpleNamespace(names=Names("t")))
    service = dispatcher_service(bus, dispatcher, lambda: _true(), reconcile_s=1, grace_s=1)
    (events,) = [i for i in service._intakes if isinstance(i, Subscribe) and i.kind == "event"]
    await events.handlers[EVENT_CANCELED](progress("high", 3, status="canceled", total=40))
    assert "high" not in dispatcher.jobs
    assert recorder.flat("low") == list(range(20))


async def _true() -> bool:
    return True


NOW = datetime(2026, 1, 1, tzinfo=UTC)
DAY = timedelta(hours=24)


def offload_dispatcher(store: FakeDispatchStore, recorder: Recorder) -> Dispatcher:
    """A dispatcher whose lane plan offloads the jobs of alias ``half`` without a deadline
    to batch deployment ``ob`` (the plan itself: tests/unit/test_lane_plan.py)."""
    config = DispatchConfig(OWNER, 20, 4, 8, LEASE_S)

    async def plan_lanes(running: RunningJob) -> str | None:
        patient = running.expires_at is None and running.dispatched_upto == 0
        return "ob" if running.model == "half" and patient else None

    return Dispatcher(
        store, recorder.publish, recorder.announce, lambda _: True, config, plan_lanes=plan_lanes
    )


async def test_an_offloaded_job_releases_every_row_at_once_and_publishes_nothing(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job(total=100, model="half"))
    dispatcher = offload_dispatcher(store, recorder)
    assert await dispatcher.claim() == 1
    assert store.offloaded == [("job1", 100, "ob")]
    assert recorder.tasks == [] and store.advanced == []
    # The offloader's now: its lease goes back, it takes no slot and no window.
    assert dispatcher.jobs == {} and store.released == [["job1"]]


async def test_a_short_deadline_runs_realtime(store: FakeDispatchStore, recorder: Recorder) -> None:
    store.queued.append(replace(job(total=100, model="half"), expires_at=NOW + DAY))
    dispatcher = offload_dispatcher(store, recorder)
    await dispatcher.claim()
    assert store.offloaded == []
    assert recorder.indexes() == slices(0, 20, 4)


async def test_an_offload_the_ledger_refuses_keeps_nothing(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job(total=100, model="half"))
    store.lost.add("job1")
    dispatcher = offload_dispatcher(store, recorder)
    await dispatcher.claim()
    assert dispatcher.jobs == {} and recorder.tasks == []


async def test_a_job_marked_before_is_let_go_at_once(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    marked = replace(job(total=100, model="gone", dispatched_upto=100), offload_deployment="ob")
    store.queued.append(marked)
    dispatcher = offload_dispatcher(store, recorder)
    running = JOB_TRANSITIONS.labels(JobStatus.RUNNING)
    before = running._value.get()
    await dispatcher.claim()
    assert store.offloaded == [] and recorder.tasks == []
    assert dispatcher.jobs == {} and store.released == [["job1"]]
    assert running._value.get() == before  # it began running when it was marked


async def test_a_job_offloaded_now_counts_one_start(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    store.queued.append(job(total=100, model="half"))
    dispatcher = offload_dispatcher(store, recorder)
    running = JOB_TRANSITIONS.labels(JobStatus.RUNNING)
    before = running._value.get()
    await dispatcher.claim()
    assert running._value.get() == before + 1
