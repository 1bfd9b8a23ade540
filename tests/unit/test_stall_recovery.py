"""Unit tests of per-job stall recovery: only rows no live worker holds and that are no
longer queued are published again (in-memory store, fake clocks)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from relay_batches.bus.topology import results_shard
from relay_batches.messages import DecodedSlice, HeldRows, HoldingReport, JobEvent, SliceMessage
from relay_batches.model import JobStatus
from relay_batches.services.dispatcher.core import DispatchConfig, Dispatcher
from relay_batches.services.dispatcher.inflight import SEND_LOG_SPANS, InFlight, SendLog
from relay_batches.services.dispatcher.recording import UNSHARDED, ResultsQueues
from relay_batches.services.row_worker.holdings import Holdings
from tests.helpers.fakes import LEASE_S, OWNER, FakeDispatchStore, Recorder, job


class Clock:
    """A settable clock."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Waiting:
    """A settable ``rows_waiting``."""

    def __init__(self, count: int = 0) -> None:
        self.count = count

    async def __call__(self) -> int:
        return self.count


def make(
    store: FakeDispatchStore, recorder: Recorder, waiting: Waiting, wall: Clock, mono: Clock
) -> Dispatcher:
    return Dispatcher(
        store,
        recorder.publish,
        recorder.announce,
        {"gpt-4o-mini"}.__contains__,
        DispatchConfig(OWNER, 20, 4, 8, LEASE_S),
        rows_waiting=waiting,
        inflight=InFlight(OWNER, mono),
        clock=wall,
    )


async def stalled_job(store: FakeDispatchStore, recorder: Recorder, dispatcher: Dispatcher) -> None:
    """job1 (100 rows, priority 5) with rows 0..19 out; 0..9, 12, 13 have an outcome."""
    store.queued.append(job(total=100))
    await dispatcher.claim()
    assert recorder.flat() == list(range(20))
    store.outcomes["job1"] = set(range(10)) | {12, 13}
    # No progress event arrived yet, so the window stays full and nothing is topped up.
    assert dispatcher.jobs["job1"].done == 0
    store.stalled["job1"] = 10
    recorder.tasks.clear()


def report(
    worker: str,
    held: dict[str, list[int]],
    marks: dict[int, float] | None = None,
    owner: str = OWNER,
) -> HoldingReport:
    """A heartbeat whose delivery marks are of slices ``owner`` published."""
    return HoldingReport(
        worker,
        6.0,
        tuple(HeldRows(b, tuple(rows)) for b, rows in held.items()),
        tuple((owner, level, at) for level, at in (marks or {}).items()),
    )


async def test_an_empty_queue_means_every_unheld_unfinished_row_is_lost(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    dispatcher = make(store, recorder, Waiting(0), Clock(), Clock())
    await stalled_job(store, recorder, dispatcher)
    assert await dispatcher.recover_stalled() == 1
    assert ("claim_stalled", OWNER, ["job1"], 120.0) in store.calls
    assert recorder.flat() == [10, 11, *range(14, 20)]
    assert dispatcher.jobs["job1"].dispatched_upto == 20, "the window is not rewound"
    # Marked: the worker that takes them first drops those that got an outcome meanwhile.
    assert all(task.resent for task, _ in recorder.tasks)


async def test_nothing_is_judged_until_a_stall_period_after_the_broker_came_back(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    # The broker connection dropped: no heartbeats came meanwhile, and the workers'
    # slices went back to the queue and out again at the reconnect (held by nobody for
    # a moment). Judged then, every row would be re-sent and paid for twice.
    connected = True
    dispatcher = Dispatcher(
        store,
        recorder.publish,
        recorder.announce,
        {"gpt-4o-mini"}.__contains__,
        DispatchConfig(OWNER, 20, 4, 8, LEASE_S),
        rows_waiting=Waiting(0),
        inflight=InFlight(OWNER, Clock()),
        clock=Clock(),
        connected=lambda: connected,
    )
    await stalled_job(store, recorder, dispatcher)
    dispatcher.sight_lost()
    connected = False
    assert await dispatcher.recover_stalled() == 0
    connected = True
    assert await dispatcher.recover_stalled() == 0
    assert ("claim_stalled", OWNER, ["job1"], 0.0) in store.calls, "its stall clock restarts"
    assert recorder.tasks == []
    # A stall period later (fresh heartbeats by then) the job is judged as usual.
    store.stalled["job1"] = 10
    assert await dispatcher.recover_stalled() == 1
    assert recorder.flat() == [10, 11, *range(14, 20)]


async def test_first_sends_are_not_marked_resent(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    dispatcher = make(store, recorder, Waiting(0), Clock(), Clock())
    store.queued.append(job(total=100))
    await dispatcher.claim()
    assert recorder.tasks and not any(task.resent for task, _ in recorder.tasks)


async def test_rows_a_live_worker_holds_are_not_sent_again(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    mono = Clock()
    dispatcher = make(store, recorder, Waiting(0), Clock(), mono)
    await stalled_job(store, recorder, dispatcher)
    await dispatcher.inflight.on_report(report("w1", {"job1": [14, 15, 16, 17, 18, 19]}))
    await dispatcher.inflight.on_report(report("w2", {"job1": [11], "other": [10]}))
    assert await dispatcher.recover_stalled() == 1
    assert recorder.flat() == [10]


async def test_rows_of_a_worker_whose_heartbeat_expired_are_sent_again(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    mono = Clock()
    dispatcher = make(store, recorder, Waiting(0), Clock(), mono)
    await stalled_job(store, recorder, dispatcher)
    await dispatcher.inflight.on_report(report("killed", {"job1": [10, 11, *range(14, 20)]}))
    mono.now += 6.5  # past the report's ttl_s: the worker is gone
    assert await dispatcher.recover_stalled() == 1
    assert recorder.flat() == [10, 11, *range(14, 20)]


async def test_queued_rows_wait_until_a_later_slice_of_their_level_was_delivered(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    wall, waiting = Clock(1000.0), Waiting(37)
    dispatcher = make(store, recorder, waiting, wall, Clock())
    await stalled_job(store, recorder, dispatcher)
    # Another job's slices, published later but on a higher level, were delivered: ours
    # may still be queued behind them.
    await dispatcher.inflight.on_report(report("w1", {}, {9: 1500.0}))
    assert await dispatcher.recover_stalled() == 1
    assert recorder.tasks == [], "rows still queued are not paid for twice"

    # A slice published after ours on our level (0: no boost) was delivered: ours are gone.
    await dispatcher.inflight.on_report(report("w1", {}, {0: 1002.0}))
    store.stalled["job1"] = 10
    assert await dispatcher.recover_stalled() == 1
    assert recorder.flat() == [10, 11, *range(14, 20)]
    assert {task.sent_at for task, _ in recorder.tasks} == {1000.0}


async def test_a_resent_row_is_younger_than_the_marks_that_condemned_it(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    wall = Clock(1000.0)
    dispatcher = make(store, recorder, Waiting(5), wall, Clock())
    await stalled_job(store, recorder, dispatcher)
    await dispatcher.inflight.on_report(report("w1", {}, {0: 1010.0}))
    wall.now = 1020.0
    assert await dispatcher.recover_stalled() == 1
    assert len(recorder.flat()) == 8
    recorder.tasks.clear()
    store.stalled["job1"] = 10
    assert await dispatcher.recover_stalled() == 1
    assert recorder.tasks == [], "re-sent at 1020, after the latest mark (1010): queued"


async def test_a_worker_holds_a_slice_until_it_is_finished_and_reports_its_marks() -> None:
    holdings = Holdings("w1", 2.0)
    first = holdings.take(DecodedSlice("job1", "m", ((3, []), (4, [])), {}, 5, 1000.0, "d1"))
    holdings.take(DecodedSlice("job1", "m", ((1, []),), {}, 5, 1001.0, "d1"))
    holdings.take(DecodedSlice("job2", "m", ((0, []),), {}, 2, 999.0, "d1"))
    holdings.take(DecodedSlice("job3", "m", ((0, []),), {}, 5, 90.0, "d2"))
    holdings.leave(holdings.take(DecodedSlice("job3", "m", ((1, []),), {}, 5, 91.0, "d2")))
    sent = holdings.report()
    assert sent == HoldingReport(
        "w1",
        6.0,
        (HeldRows("job1", (1, 3, 4)), HeldRows("job2", (0,)), HeldRows("job3", (0,))),
        (("d1", 2, 999.0), ("d1", 5, 1001.0), ("d2", 5, 91.0)),
    )
    assert HoldingReport.decode(sent.encode()) == sent
    holdings.leave(first)
    assert holdings.report() == HoldingReport(
        "w1",
        6.0,
        (HeldRows("job1", (1,)), HeldRows("job2", (0,)), HeldRows("job3", (0,))),
        (),
    )


def test_the_send_log_forgets_old_spans_into_its_floor() -> None:
    sent = SendLog(100.0)
    for i in range(SEND_LOG_SPANS + 2):
        sent.record(i * 4, i * 4 + 4, 200.0 + i)
    assert sent.sent(0) == (0, 201.0), "forgotten: at most the newest forgotten stamp"
    assert sent.sent(8) == (0, 202.0)
    assert sent.sent(4 * (SEND_LOG_SPANS + 1)) == (0, 200.0 + SEND_LOG_SPANS + 1)
    assert sent.sent(10_000) == (0, 201.0)


async def test_rows_sent_on_a_raised_level_are_judged_on_that_level() -> None:
    sent = SendLog(100.0)
    sent.record(0, 4, 200.0, level=3)
    sent.record(4, 8, 201.0)
    assert sent.sent(2) == (3, 200.0)
    assert sent.sent(5) == (0, 201.0)
    inflight = InFlight(OWNER, Clock())
    # A level-5 slice delivered later says nothing of level 3: it is served first.
    await inflight.on_report(report("w1", {}, {5: 300.0}))
    assert not inflight.delivered_after(*sent.sent(2))
    # A level-3 (or lower) slice delivered later: ours on level 3 left the queue before.
    await inflight.on_report(report("w1", {}, {2: 300.0}))
    assert inflight.delivered_after(*sent.sent(2))
    assert inflight.delivered_after(*sent.sent(5)) is False  # level 0 needs a level-0 mark


async def test_clocks_of_two_dispatchers_90_s_apart_never_condemn_queued_rows(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    wall, waiting = Clock(1000.0), Waiting(37)
    dispatcher = make(store, recorder, waiting, wall, Clock())
    await stalled_job(store, recorder, dispatcher)  # ours went out at 1000 (our clock)
    # A dispatcher whose clock is 90 s ahead: its slice, published after ours on our
    # level, was delivered; ours may still be queued (it says nothing of our clock).
    await dispatcher.inflight.on_report(report("w1", {}, {0: 1090.0}, owner="fast"))
    assert await dispatcher.recover_stalled() == 1
    assert recorder.tasks == [], "queued rows are not paid for twice"
    # A dispatcher 90 s behind, whose slice was delivered: ignored just the same (it
    # would hold back real recovery if it were compared).
    await dispatcher.inflight.on_report(report("w1", {}, {0: 910.0}, owner="slow"))
    store.stalled["job1"] = 10
    assert await dispatcher.recover_stalled() == 1
    assert recorder.tasks == []
    # Our own later slice delivered, on our clock: ours left the queue, they are lost.
    await dispatcher.inflight.on_report(report("w1", {}, {0: 1000.5}))
    store.stalled["job1"] = 10
    assert await dispatcher.recover_stalled() == 1
    assert recorder.flat() == [10, 11, *range(14, 20)]
    assert {task.owner for task, _ in recorder.tasks} == {OWNER}


def test_a_mark_of_a_worker_from_before_owners_names_no_dispatcher() -> None:
    body = HoldingReport("w1", 6.0, (), (("d1", 0, 5.0),)).encode()
    old = body.replace(b'["d1",0,5.0]', b"[0,5.0]")
    assert HoldingReport.decode(old).marks == (("", 0, 5.0),)


def one_shard(ready: int, consumers: int) -> ResultsQueues:
    """Results queues of one shard (every job's) with ``ready`` messages, the unsharded
    queue empty, both with ``consumers`` consumers."""
    return ResultsQueues((0, consumers), ((ready, consumers),))


def probed(
    store: FakeDispatchStore,
    recorder: Recorder,
    results_state: Callable[[], Awaitable[ResultsQueues]],
    mono: Clock,
) -> Dispatcher:
    """A dispatcher (stall timeout 10 s, empty rows queue) that probes ``results``."""
    return Dispatcher(
        store,
        recorder.publish,
        recorder.announce,
        {"gpt-4o-mini"}.__contains__,
        DispatchConfig(OWNER, 20, 4, 8, LEASE_S, stall_s=10.0),
        rows_waiting=Waiting(0),
        inflight=InFlight(OWNER, mono),
        results_state=results_state,
        clock=mono,
    )


async def test_nothing_is_judged_while_the_aggregator_is_behind(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    state = [one_shard(0, 0)]

    async def results_state() -> ResultsQueues:
        return state[-1]

    mono = Clock()
    dispatcher = probed(store, recorder, results_state, mono)
    await stalled_job(store, recorder, dispatcher)
    mono.now += 6.0  # no outcome recorded for more than half a stall timeout
    store.silences = {"job1": 6.0}
    # Nobody consumes results; outcomes wait on it while nothing is recorded.
    for behind in (one_shard(0, 0), one_shard(12, 1)):
        state.append(behind)
        assert await dispatcher.recover_stalled() == 0
        assert not [c for c in store.calls if c[0] == "claim_stalled"], "stall clock kept"
        assert recorder.tasks == []
    state.append(one_shard(0, 1))  # caught up: its last outcomes get a stall timeout to land
    assert await dispatcher.recover_stalled() == 0
    assert ("claim_stalled", OWNER, ["job1"], 0.0) in store.calls, "stall clocks restart"
    assert recorder.tasks == []
    store.stalled["job1"] = 10  # a stall timeout later: still without an outcome, lost
    assert await dispatcher.recover_stalled() == 1
    assert recorder.flat() == [10, 11, *range(14, 20)]


async def test_a_busy_aggregator_with_messages_ready_does_not_hold_recovery_back(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    mono = Clock()

    async def results_state() -> ResultsQueues:
        return one_shard(40, 1)  # always some outcomes ready: the aggregator is busy, not stuck

    dispatcher = probed(store, recorder, results_state, mono)
    await stalled_job(store, recorder, dispatcher)
    mono.now += 30.0
    store.silences = {"job9": 1.0}  # an outcome of another job recorded a second ago
    assert await dispatcher.recover_stalled() == 1
    assert recorder.flat() == [10, 11, *range(14, 20)], "job1's lost rows are re-sent"


async def two_stalled_jobs(
    store: FakeDispatchStore, recorder: Recorder, dispatcher: Dispatcher
) -> None:
    """job1 (results shard 1 of 2) and ``other`` (shard 0), each with rows 0..19 out and
    0..9, 12, 13 recorded, both without progress for a stall timeout."""
    assert (results_shard("job1", 2), results_shard("other", 2)) == (1, 0)
    store.queued += [job("job1"), job("other")]
    await dispatcher.claim()
    for batch_id in ("job1", "other"):
        assert recorder.flat(batch_id) == list(range(20))
        store.outcomes[batch_id] = set(range(10)) | {12, 13}
        store.stalled[batch_id] = 10
    recorder.tasks.clear()


LOST = [10, 11, *range(14, 20)]


def stall_claims(store: FakeDispatchStore) -> list[tuple[list[str], float]]:
    """The jobs and stall timeout of each ``claim_stalled`` so far."""
    return [(call[2], call[3]) for call in store.calls if call[0] == "claim_stalled"]


async def test_a_silent_shard_holds_back_only_its_own_jobs(
    store: FakeDispatchStore, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    """job1's outcomes go to shard 1, whose aggregator lost the ledger: its messages wait
    there while shard 0's aggregator records job ``other`` a second ago. The newest
    recording over every job would look fine; shard 1's own is 30 s old, so job1 is not
    judged until shard 1 catches up, while ``other``'s lost rows are re-sent at once."""
    state = [ResultsQueues((0, 2), ((3, 1), (25, 1)))]

    async def results_state() -> ResultsQueues:
        return state[-1]

    mono = Clock()
    dispatcher = probed(store, recorder, results_state, mono)
    await two_stalled_jobs(store, recorder, dispatcher)
    mono.now += 60.0
    store.silences = {"other": 1.0, "job1": 30.0}
    caplog.set_level("INFO", "relay.dispatcher")
    assert await dispatcher.recover_stalled() == 1
    assert stall_claims(store) == [(["other"], 10.0)], "job1's stall clock kept"
    assert (recorder.flat("other"), recorder.flat("job1")) == (LOST, [])
    deferred = [r for r in caplog.records if r.getMessage() == "stall_recovery_deferred"]
    assert [(r.__dict__["shards"], r.__dict__["held_back"]) for r in deferred] == [([1], 1)]

    store.stalled["other"] = 10  # still behind: job1 waits, other is judged again
    assert await dispatcher.recover_stalled() == 1
    assert stall_claims(store)[1:] == [(["other"], 10.0)]
    assert recorder.flat("job1") == []

    state.append(ResultsQueues((0, 2), ((3, 1), (0, 1))))  # shard 1 drained
    recorder.tasks.clear()
    assert await dispatcher.recover_stalled() == 0
    assert stall_claims(store)[2:] == [(["job1"], 0.0), (["other"], 10.0)], (
        "only the caught-up shard's jobs have their stall clocks restarted"
    )
    assert recorder.tasks == []
    resumed = [r for r in caplog.records if r.getMessage() == "stall_recovery_resumed"]
    assert [r.__dict__["shards"] for r in resumed] == [[1]]
    store.stalled["job1"] = 10  # a stall timeout later: still without an outcome, lost
    assert await dispatcher.recover_stalled() == 1
    assert recorder.flat("job1") == LOST


async def test_a_shard_nobody_consumes_holds_back_only_its_own_jobs(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    """Shard 0 (``other``'s) has no consumer, without a ledger read: job1 on shard 1 is
    recovered; ``other`` is not, and its stall clock is kept."""

    async def results_state() -> ResultsQueues:
        return ResultsQueues((0, 1), ((0, 0), (0, 1)))

    mono = Clock()
    dispatcher = probed(store, recorder, results_state, mono)
    await two_stalled_jobs(store, recorder, dispatcher)
    mono.now += 60.0
    assert await dispatcher.recover_stalled() == 1
    assert stall_claims(store) == [(["job1"], 10.0)]
    assert (recorder.flat("job1"), recorder.flat("other")) == (LOST, [])


async def test_the_unsharded_queue_behind_holds_back_every_job(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    """``<ns>.results`` may carry any job's outcomes: while it is behind no job is judged,
    and once it caught up every job's stall clock restarts."""
    state = [ResultsQueues((7, 1), ((0, 1), (0, 1)))]

    async def results_state() -> ResultsQueues:
        return state[-1]

    mono = Clock()
    dispatcher = probed(store, recorder, results_state, mono)
    await two_stalled_jobs(store, recorder, dispatcher)
    mono.now += 60.0
    store.silences = {"job1": 30.0, "other": 30.0}
    assert await dispatcher.recover_stalled() == 0
    state.append(ResultsQueues((0, 0), ((0, 1), (0, 1))))  # now nobody consumes it
    assert await dispatcher.recover_stalled() == 0
    assert stall_claims(store) == [], "no stall clock restarted while it is behind"
    assert recorder.tasks == []
    state.append(ResultsQueues((0, 1), ((0, 1), (0, 1))))
    assert await dispatcher.recover_stalled() == 0
    assert stall_claims(store) == [(["job1", "other"], 0.0)]
    for batch_id in ("job1", "other"):
        store.stalled[batch_id] = 10
    assert await dispatcher.recover_stalled() == 2
    assert (recorder.flat("job1"), recorder.flat("other")) == (LOST, LOST)


async def test_a_shard_behind_with_none_of_our_jobs_holds_nothing_back(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    """Shard 1 drains late outcomes of jobs no longer running (none recorded: silent
    since we started): ours all map to shard 0 of 2 and are recovered as usual."""

    async def results_state() -> ResultsQueues:
        return ResultsQueues((0, 1), ((0, 1), (40, 1)))

    mono = Clock()
    dispatcher = probed(store, recorder, results_state, mono)
    store.queued.append(job("other"))
    await dispatcher.claim()
    store.outcomes["other"] = set(range(10)) | {12, 13}
    store.stalled["other"] = 10
    recorder.tasks.clear()
    mono.now += 60.0
    store.silences = {"other": 1.0}
    assert await dispatcher.recover_stalled() == 1
    assert recorder.flat("other") == LOST


@pytest.mark.parametrize(
    ("queues", "silences", "behind"),
    [
        # Shard 1 waits with only an old recording of its jobs: behind, whatever shard 0 does.
        (ResultsQueues((0, 1), ((4, 1), (4, 1))), {"other": 1.0, "job1": 30.0}, [1]),
        # Ready messages on a shard whose running jobs have nothing recorded: silent since
        # the dispatcher started (uptime 100 s).
        (ResultsQueues((0, 1), ((4, 1), (4, 1))), {"other": 1.0}, [1]),
        # The unsharded queue carries any job's outcomes: the newest over all of them.
        (ResultsQueues((7, 1), ((0, 1), (0, 1))), {"other": 1.0, "job1": 30.0}, []),
        (ResultsQueues((7, 1), ((0, 1), (0, 1))), {"job1": 30.0}, [UNSHARDED]),
        # No message waits: nothing is silent, however old the recordings.
        (ResultsQueues((0, 1), ((0, 1), (0, 1))), {"job1": 300.0}, []),
    ],
)
def test_silence_is_judged_per_results_queue(
    queues: ResultsQueues, silences: dict[str, float], behind: list[int]
) -> None:
    assert queues.silent(silences, uptime=100.0, limit=5.0) == behind
    assert queues.silent(silences, uptime=4.0, limit=5.0) == [], "capped by our uptime"


def test_a_queue_nobody_consumes_is_behind_without_a_ledger_read() -> None:
    assert ResultsQueues((0, 1), ((0, 1), (0, 0))).unconsumed() == [1]
    assert ResultsQueues((0, 0), ((0, 1),)).unconsumed() == [UNSHARDED]


# --- rows recorded as released that never went out ------------------------------------


async def test_rows_whose_publish_failed_are_lost_once_a_later_slice_of_ours_was_delivered(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    """The release is recorded before the publish: if the publish fails, the rows are
    released in the ledger but never out. Their send stamp (taken before the publish)
    makes them lost as soon as a slice we published after them was delivered, even with
    other rows still queued; before that they may be queued and are left alone."""
    wall, waiting, broken = Clock(1000.0), Waiting(5), [False]

    async def publish(task: SliceMessage, level: int) -> None:
        if broken[0]:
            raise ConnectionError("broker went away")
        await recorder.publish(task, level)

    dispatcher = Dispatcher(
        store,
        publish,
        recorder.announce,
        {"gpt-4o-mini"}.__contains__,
        DispatchConfig(OWNER, 20, 4, 8, LEASE_S),
        rows_waiting=waiting,
        inflight=InFlight(OWNER, Clock()),
        clock=wall,
    )
    store.queued.append(job(total=100))
    await dispatcher.claim()  # rows 0..19 at 1000
    wall.now, broken[0] = 1001.0, True
    with pytest.raises(ConnectionError):
        await dispatcher.on_progress(JobEvent("job1", JobStatus.RUNNING, 100, 8, 0))
    assert store.advanced == [("job1", 20), ("job1", 28)], "20..27 released, never out"
    wall.now, broken[0] = 1002.0, False
    await dispatcher.on_progress(JobEvent("job1", JobStatus.RUNNING, 100, 16, 0))
    assert recorder.flat() == [*range(20), *range(28, 36)]
    store.outcomes["job1"] = set(range(20)) | set(range(28, 36))
    recorder.tasks.clear()

    await dispatcher.inflight.on_report(report("w1", {}, {0: 1000.0}))  # only 0..19 left
    store.stalled["job1"] = 20
    assert await dispatcher.recover_stalled() == 1
    assert recorder.tasks == [], "nothing after them delivered yet: they may be queued"
    await dispatcher.inflight.on_report(report("w1", {}, {0: 1002.0}))  # 28..35 delivered
    store.stalled["job1"] = 20
    assert await dispatcher.recover_stalled() == 1
    assert recorder.flat() == list(range(20, 28))


async def test_rows_an_owner_released_but_never_published_before_it_died_are_resent(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    """The owner recorded rows 20..39 as released and died before publishing them: the
    dispatcher that takes the job over cannot tell them from rows still queued until the
    queue is empty (or a slice it published later was delivered), then re-sends them."""
    waiting = Waiting(3)
    dispatcher = make(store, recorder, waiting, Clock(), Clock())
    store.expired.append(job(total=100, completed=20, dispatched_upto=40))
    store.outcomes["job1"] = set(range(20))
    await dispatcher.claim()
    assert recorder.tasks == [], "its window (20) is full of the rows in question"
    store.stalled["job1"] = 20
    assert await dispatcher.recover_stalled() == 1
    assert recorder.tasks == []
    waiting.count = 0
    store.stalled["job1"] = 20
    assert await dispatcher.recover_stalled() == 1
    assert recorder.flat() == list(range(20, 40))


async def test_a_dispatcher_just_started_gives_the_aggregator_half_a_stall_timeout(
    store: FakeDispatchStore, recorder: Recorder
) -> None:
    """No running job has a recorded outcome yet (``recording_silences`` is empty): that is
    no evidence against the aggregator until we have been up half a stall timeout."""
    mono = Clock()

    async def results_state() -> ResultsQueues:
        return one_shard(40, 1)

    dispatcher = probed(store, recorder, results_state, mono)
    await stalled_job(store, recorder, dispatcher)
    mono.now += 4.0
    assert await dispatcher.recover_stalled() == 1, "up 4 s of a 10 s stall timeout"
    recorder.tasks.clear()
    mono.now += 2.0
    store.stalled["job1"] = 10
    assert await dispatcher.recover_stalled() == 0, "up 6 s, and still nothing recorded"
    assert recorder.tasks == []
