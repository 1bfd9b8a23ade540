"""Unit tests of pacing: slices and windows sized in time from each job's pace (the
arithmetic, the pace learned from progress events, a dispatcher releasing by it), the
new tenant's broker level, and the latency the aggregator's progress events carry."""

from __future__ import annotations

import pytest

from relay_batches.bus.topology import rows_prefetch
from relay_batches.messages import HoldingReport, JobEvent, RowOutcome
from relay_batches.messages.codec import dump
from relay_batches.services.aggregator.core import mean_latencies
from relay_batches.services.dispatcher.core import DispatchConfig, Dispatcher
from relay_batches.services.dispatcher.inflight import InFlight
from relay_batches.services.dispatcher.pacing import (
    SLICE_AHEAD_S,
    Paces,
    paced_window,
    slice_size,
)
from tests.helpers.fakes import LEASE_S, OWNER, FakeDispatchStore, Recorder, job

BASE = 64


@pytest.mark.parametrize(
    ("latency_s", "concurrencies", "size"),
    [
        (0.002, (16, 16), 64),  # fast rows: full slices, as before
        (0.05, (8,), 64),
        (0.2, (4, 4), 12),  # 2 slices of 12: 4 running, 20 ahead = 1 s
        (1.0, (4, 4), 4),  # one row per slot: 4 ahead = 1 s
        (5.0, (4, 4), 4),  # never fewer rows than the widest worker's slots
        (1.0, (4, 32), 32),
        (None, (4, 4), 4),  # pace unknown: the smallest
        (None, (), 4),  # nothing known: one worker of the default concurrency assumed
    ],
)
def test_slices_hold_about_a_second_ahead_and_stay_full_when_rows_are_fast(
    latency_s: float | None, concurrencies: tuple[int, ...], size: int
) -> None:
    assert slice_size(latency_s, concurrencies, BASE, 50_000) == size


@pytest.mark.parametrize("latency_s", [0.05, 0.1, 0.2, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("concurrency", [4, 8, 16, 32])
def test_a_worker_holds_about_a_second_of_work_ahead_and_keeps_its_slots_busy(
    latency_s: float, concurrency: int
) -> None:
    size = slice_size(latency_s, (concurrency,), BASE, 50_000)
    held = rows_prefetch(concurrency, BASE) * size
    ahead_s = (held - concurrency) * latency_s / concurrency
    assert ahead_s <= max(SLICE_AHEAD_S, latency_s) * 1.25, (size, ahead_s)
    assert held >= 2 * concurrency, "every slot has its next row at hand"


def test_a_small_job_and_a_big_one_s_last_rows_are_spread_over_the_workers() -> None:
    # Two workers: 10 rows go in slices of 5, one on each.
    assert slice_size(0.2, (4, 4), BASE, 10) == 5
    assert slice_size(0.002, (16, 16), BASE, 1) == 1
    assert slice_size(0.002, (32,) * 4, BASE, 128) == 32, "the last 128 over 4 workers"
    assert slice_size(0.002, (32,) * 4, BASE, 1024) == BASE


def test_the_window_is_what_the_workers_hold_plus_two_seconds_of_throughput() -> None:
    # 2 workers x 4 slots at 1 s: they hold 2 x 2 slices of 4; 8 rows/s for 2 s.
    assert paced_window(1.0, (4, 4), 4, BASE) == 16 + 16
    assert paced_window(1.0, (4, 4), 4, BASE, dispatchers=2) == 16
    assert paced_window(None, (4, 4), 4, BASE) == 16 + 8, "unknown: one row per slot"
    assert paced_window(0.001, (16, 16), 64, BASE) > 1024, "fast: the row window caps it"


def test_a_pace_is_a_mean_of_readings_per_job_and_goes_with_its_job() -> None:
    paces = Paces(capacity=2)
    assert paces.latency_s("a") is None
    paces.observe("a", 0)  # nothing measured
    assert paces.latency_s("a") is None
    paces.observe("a", 1000)
    assert paces.latency_s("a") == 1.0
    paces.observe("a", 2000)
    assert 1.0 < (paces.latency_s("a") or 0) < 2.0
    paces.observe("b", 10)
    paces.observe("c", 10)
    assert paces.latency_s("a") is None, "the oldest is forgotten past the capacity"
    paces.forget("b")
    assert paces.latency_s("b") is None and paces.latency_s("c") == 0.01


def paced_dispatcher(
    overtaking: list[tuple[JobEvent, int]] | None = None,
) -> tuple[FakeDispatchStore, Recorder, InFlight, Dispatcher]:
    """A paced dispatcher of slices up to 64 rows and a window of 1,024, with one live
    row-worker of 4 slots; ``overtaking`` gathers its ``job.overtaking`` events, each
    with the slices published before it."""
    store, recorder = FakeDispatchStore(), Recorder()

    async def announce_overtaking(event: JobEvent) -> None:
        if overtaking is not None:
            overtaking.append((event, len(recorder.tasks)))

    inflight = InFlight(OWNER)
    config = DispatchConfig(OWNER, 1024, BASE, 8, LEASE_S, window_bytes=10**8, paced=True)
    dispatcher = Dispatcher(
        store,
        recorder.publish,
        recorder.announce,
        {"gpt-4o-mini"}.__contains__,
        config,
        inflight=inflight,
        announce_overtaking=announce_overtaking,
    )
    return store, recorder, inflight, dispatcher


async def progress(dispatcher: Dispatcher, store: FakeDispatchStore, done: int, ms: float) -> None:
    """Rows below ``done`` of job1 answered, at ``ms`` each."""
    store.outcomes["job1"] = set(range(done))
    await dispatcher.on_progress(JobEvent("job1", "running", 5000, done, 0, latency_ms=ms))


async def test_slow_rows_go_in_small_slices_and_a_window_of_seconds() -> None:
    store, recorder, inflight, dispatcher = paced_dispatcher()
    await inflight.on_report(HoldingReport("w1", 6.0, (), (), 4))
    store.queued.append(job(total=5000))
    await dispatcher.claim()
    # Pace unknown: slices of 4, what the worker holds of them (2 x 4) and 4 more.
    assert recorder.indexes() == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    await progress(dispatcher, store, 4, 1000)
    # 1 s a row: slices of 4, a window of 8 held + 8 (2 s at 4 rows/s): 16 past row 4.
    assert recorder.flat() == list(range(20))
    assert {len(part) for part in recorder.indexes()} == {4}


async def test_fast_rows_keep_64_row_slices_and_the_row_window() -> None:
    store, recorder, inflight, dispatcher = paced_dispatcher()
    await inflight.on_report(HoldingReport("w1", 6.0, (), (), 4))
    store.queued.append(job(total=5000))
    await dispatcher.claim()
    await progress(dispatcher, store, 4, 2)
    # The row window (1,024 past row 4) filled in whole 64-row slices after the first 12.
    assert recorder.flat() == list(range(12 + 15 * BASE))
    assert {len(part) for part in recorder.indexes()[3:]} == {BASE}


async def test_a_job_of_a_workspace_with_nothing_in_flight_goes_above_the_others() -> None:
    store, recorder, inflight, dispatcher = paced_dispatcher()
    await inflight.on_report(HoldingReport("w1", 6.0, (), (), 4))
    store.queued.append(job("big", total=5000, workspace="ws-a"))
    await dispatcher.claim()
    store.queued.append(job("again", total=10, workspace="ws-a"))
    store.queued.append(job("new", total=10, workspace="ws-b"))
    await dispatcher.claim()
    levels = {task.batch_id: level for task, level in recorder.tasks}
    assert levels == {"big": 0, "again": 0, "new": 1}


async def test_a_boosted_job_announces_its_level_once_after_its_rows_are_out() -> None:
    overtaking: list[tuple[JobEvent, int]] = []
    store, recorder, inflight, dispatcher = paced_dispatcher(overtaking)
    await inflight.on_report(HoldingReport("w1", 6.0, (), (), 4))
    store.queued.append(job("big", total=5000, workspace="ws-a"))
    await dispatcher.claim()
    assert overtaking == [], "nothing to overtake"
    store.queued.append(job("new", total=10, workspace="ws-b"))
    await dispatcher.claim()
    ((event, published_before),) = overtaking
    assert (event.batch_id, event.level) == ("new", 1)
    assert published_before == len(recorder.tasks), "announced after its slices went out"
    assert JobEvent.decode(event.encode()) == event


def test_progress_events_carry_the_mean_latency_of_the_outcomes_they_follow() -> None:
    outcomes = [
        RowOutcome("a", 0, "x", None, 1, latency_ms=100),
        RowOutcome("a", 1, "x", None, 1, latency_ms=300),
        RowOutcome("b", 0, None, "err", 1),
    ]
    assert mean_latencies(outcomes) == {"a": 200.0}
    event = JobEvent("a", "running", 10, 2, 0, latency_ms=200.0)
    assert JobEvent.decode(event.encode()) == event
    older = dump("job", {"batch_id": "a", "status": "running", "total": 1, "completed": 0,
                         "failed": 0})  # fmt: skip
    assert JobEvent.decode(older).latency_ms == 0.0, "an event from before pacing"
