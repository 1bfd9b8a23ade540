"""Unit tests of the window that grows with the row-worker fleet: the arithmetic, the
concurrency the heartbeats report (old ones included), and a dispatcher releasing a grown
window of one job (in-memory store, fake clock)."""

from __future__ import annotations

import pytest

from relay_batches.bus.topology import EVENT_PROGRESS, event_kind, progress_key
from relay_batches.messages import HeldRows, HoldingReport, JobEvent
from relay_batches.services.dispatcher.core import DispatchConfig, Dispatcher
from relay_batches.services.dispatcher.inflight import InFlight
from relay_batches.services.dispatcher.sharing import Windows
from relay_batches.services.row_worker.holdings import Holdings
from tests.helpers.fakes import LEASE_S, OWNER, FakeDispatchStore, Recorder, job

MIB = 1024 * 1024
WINDOWS = Windows(base=1024, base_bytes=16 * MIB, max_rows=65536, max_bytes=256 * MIB)


class Clock:
    """A settable clock."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("concurrency", "rows", "size"),
    [
        (0, 1024, 16 * MIB),  # no heartbeat yet: the base window
        (100, 1024, 16 * MIB),  # a small fleet is kept busy by the base window
        (512, 1024, 16 * MIB),
        (1000, 2000, 16 * MIB * 2000 // 1024),  # 1,000 rows at once: twice as many rows
        (16384, 32768, 256 * MIB),  # the bytes reach their bound first
        (10**6, 65536, 256 * MIB),  # both bounded
    ],
)
def test_the_window_is_twice_the_live_concurrency_within_its_bounds(
    concurrency: int, rows: int, size: int
) -> None:
    assert WINDOWS.for_fleet(concurrency) == (rows, size)


def test_a_window_without_room_to_grow_stays_at_its_base() -> None:
    assert Windows(64, 4096, 64, 4096).for_fleet(1000) == (64, 4096)
    config = DispatchConfig(OWNER, 64, 4, 8, LEASE_S, window_bytes=4096)
    assert config.windows.for_fleet(1000) == (64, 4096), "no maximum set: no growth"


@pytest.mark.parametrize(
    ("concurrency", "dispatchers", "workspaces", "rows", "size"),
    [
        # 2 x 16,384 rows at once over two dispatchers: 16,384 rows each, 256 MiB of bytes.
        (16384, 2, 1, 16384, 256 * MIB),
        # That total split by four workspaces: a quarter each.
        (16384, 2, 4, 4096, 64 * MIB),
        # Never below the base per workspace, however many share the total.
        (16384, 2, 64, 1024, 16 * MIB),
        # A huge fleet: the total is the maximum, whatever the workspaces (not 3 x 64 Ki).
        (10**6, 1, 3, 65536 // 3, 256 * MIB // 3),
        # Many dispatchers: each one's total falls back to the base.
        (1000, 8, 1, 1024, 16 * MIB),
    ],
)
def test_the_grown_total_is_per_dispatcher_and_split_between_its_workspaces(
    concurrency: int, dispatchers: int, workspaces: int, rows: int, size: int
) -> None:
    assert WINDOWS.for_fleet(concurrency, dispatchers, workspaces) == (rows, size)


@pytest.mark.parametrize("workspaces", [1, 2, 3, 7, 64, 65, 1000])
@pytest.mark.parametrize("dispatchers", [1, 2, 5])
def test_a_dispatcher_never_holds_more_than_its_bound(dispatchers: int, workspaces: int) -> None:
    """Over all its workspaces: at most max(W x base, max) rows and bytes."""
    rows, size = WINDOWS.for_fleet(10**7, dispatchers, workspaces)
    assert workspaces * rows <= max(workspaces * WINDOWS.base, WINDOWS.max_rows)
    assert workspaces * size <= max(workspaces * WINDOWS.base_bytes, WINDOWS.max_bytes)


async def test_live_dispatchers_are_the_owners_the_valid_heartbeats_name() -> None:
    mono = Clock()
    inflight = InFlight(OWNER, mono)
    assert inflight.dispatchers() == 1, "ourselves, before any heartbeat"
    await inflight.on_report(HoldingReport("w1", 6.0, (), (("d2", 0, 1.0), (OWNER, 0, 1.0)), 8))
    await inflight.on_report(HoldingReport("w2", 6.0, (), (("d3", 0, 1.0), ("", 0, 1.0)), 8))
    assert inflight.dispatchers() == 3, "us, d2 and d3 (an owner-less mark names nobody)"
    mono.now += 4.0
    await inflight.on_report(HoldingReport("w1", 6.0, (), (), 8))  # d2's slices no longer taken
    mono.now += 3.0  # the heartbeats that named d2 and d3 expired
    assert inflight.dispatchers() == 1


async def test_live_concurrency_is_summed_over_workers_whose_heartbeat_is_valid() -> None:
    mono = Clock()
    inflight = InFlight(OWNER, mono)
    await inflight.on_report(HoldingReport("w1", 6.0, (), (), 32))
    await inflight.on_report(HoldingReport("w2", 6.0, (HeldRows("j", (1,)),), (), 8))
    await inflight.on_report(HoldingReport("w1", 6.0, (), (), 32))  # replaces w1's
    assert inflight.concurrency() == 40
    # Sized to feed every worker whole slices: with slices of 64 a worker of 8 slots
    # holds 2 of them (128 rows), so it counts as 64; one of 32 holds 2 too (64 x 2 / 2).
    assert inflight.fed_concurrency(64) == 64 + 64
    assert inflight.fed_concurrency(16) == 40 + 16  # 32: 5 x 16 / 2; 8: 2 x 16 / 2 = 16
    mono.now += 7.0  # both heartbeats expired: killed, or cut off
    assert inflight.concurrency() == 0
    assert inflight.fed_concurrency(64) == 0


def test_a_heartbeat_carries_the_worker_concurrency_and_an_old_one_decodes_with_none() -> None:
    report = Holdings("w1", 2.0, 16).report()
    assert report.concurrency == 16
    assert HoldingReport.decode(report.encode()) == report
    old = report.encode().replace(b',"concurrency":16', b"")
    assert b"concurrency" not in old
    assert HoldingReport.decode(old).concurrency == 0


def grown_window_dispatcher() -> tuple[FakeDispatchStore, Recorder, InFlight, Dispatcher]:
    """A dispatcher of a base window of 20 rows that the fleet's holdings can grow to 1,000,
    with its store, recorder and in-flight view."""
    store, recorder, mono = FakeDispatchStore(), Recorder(), Clock()
    config = DispatchConfig(
        OWNER, 20, 4, 8, LEASE_S, window_bytes=1_000_000, window_max=1000, window_max_bytes=10**8
    )
    inflight = InFlight(OWNER, mono)
    dispatcher = Dispatcher(
        store,
        recorder.publish,
        recorder.announce,
        {"gpt-4o-mini"}.__contains__,
        config,
        inflight=inflight,
        clock=mono,
    )
    return store, recorder, inflight, dispatcher


async def test_a_dispatcher_with_a_big_fleet_releases_more_than_its_base_window() -> None:
    store, recorder, inflight, dispatcher = grown_window_dispatcher()
    await inflight.on_report(HoldingReport("w1", 6.0, (), (), 50))
    store.queued.append(job(total=500))
    await dispatcher.claim()
    # What the worker holds: its prefetch of 26 slices of 4 (2 x 50 rows, plus one).
    assert recorder.flat() == list(range(104)), "the worker's 104 rows, not the base 20"


async def test_a_top_up_reads_the_bytes_in_flight_once() -> None:
    """A grown window fills in many releases of a few slices: only the first reads the
    rows in flight from the ledger, the others only the sizes of the rows to come."""
    store, recorder, inflight, dispatcher = grown_window_dispatcher()
    await inflight.on_report(HoldingReport("w1", 6.0, (), (), 500))
    store.queued.append(job(total=5000, dispatched_upto=100, completed=100))
    await dispatcher.claim()
    # 1,000 rows of window, filled in releases of 64 rows while a quarter of it is free.
    assert recorder.flat() == list(range(100, 868))
    assert [flying for flying, _, _ in store.byte_reads] == [100] + [0] * 11
    assert [(upto, end) for _, upto, end in store.byte_reads[:2]] == [(100, 164), (164, 228)]


async def test_later_top_ups_read_no_rows_in_flight_while_their_bytes_leave_room() -> None:
    """The bytes in flight are kept as an upper bound across top-ups: progress events
    release more rows reading only the sizes of the rows to come, until the bound
    would hold a release back; then the rows in flight are read again (exactly)."""
    store, recorder = FakeDispatchStore(), Recorder()
    config = DispatchConfig(OWNER, 20, 4, 8, LEASE_S, window_bytes=1_000_000)
    dispatcher = Dispatcher(
        store, recorder.publish, recorder.announce, {"gpt-4o-mini"}.__contains__, config
    )
    store.queued.append(job(total=100))
    await dispatcher.claim()
    assert recorder.flat() == list(range(20))
    for done in (8, 16):
        store.outcomes["job1"] = set(range(done))
        await dispatcher.on_progress(JobEvent("job1", "running", 100, done, 0))
    assert recorder.flat() == list(range(36))
    # One read of the rows in flight (none, at the claim); every later one is empty.
    assert [flying for flying, _, _ in store.byte_reads] == [0, 0, 0]
    owned = dispatcher.jobs["job1"]
    assert owned.flying == sum(store.size(i) for i in range(36))
    # A byte window the bound fills: the next top-up reads what is really out.
    owned.flying = 1_000_000
    store.outcomes["job1"] = set(range(24))
    await dispatcher.on_progress(JobEvent("job1", "running", 100, 24, 0))
    assert store.byte_reads[-1][0] == 36, "rows 0..35 (settled below 0 at the first read)"
    assert recorder.flat() == list(range(44))
    assert owned.settled_below == 24
    assert owned.flying == sum(store.size(i) for i in range(24, 44))


def test_progress_keys_are_one_topic_word_per_owner_and_count_as_one_kind() -> None:
    assert progress_key("dispatcher-0a1b2c") == "job.progress.dispatcher-0a1b2c"
    assert progress_key("a.b*c#") == "job.progress.a_b_c_"
    assert progress_key("") == "job.progress._"
    assert event_kind(progress_key("dispatcher-0a1b2c")) == EVENT_PROGRESS
    assert event_kind(EVENT_PROGRESS) == EVENT_PROGRESS
