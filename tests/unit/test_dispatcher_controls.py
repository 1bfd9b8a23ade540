"""The dispatcher's side of the controls on rows not yet started: rows row-workers handed
back (a pause) go out again first, once, in slices carrying the job's pause count; a
budgeted job's releases stop at what its budget left pays for at the estimated cost."""

from __future__ import annotations

from dataclasses import replace

from relay_batches.router.aliases import Price
from relay_batches.services.dispatcher.budget import row_estimate
from relay_batches.services.dispatcher.core import DispatchConfig, Dispatcher
from tests.helpers.fakes import LEASE_S, OWNER, FakeDispatchStore, Recorder, job, messages_json

PRICE = Price(1000.0, 2000.0)


def make_dispatcher(store: FakeDispatchStore, recorder: Recorder, window: int = 20) -> Dispatcher:
    config = DispatchConfig(OWNER, window, 4, 8, LEASE_S)
    return Dispatcher(
        store,
        recorder.publish,
        recorder.announce,
        {"gpt-4o-mini"}.__contains__,
        config,
        price_of=lambda alias: PRICE,
    )


async def test_rows_handed_back_go_out_again_first_with_the_jobs_pause_count() -> None:
    store, recorder = FakeDispatchStore(), Recorder()
    # resumed after its first pause: rows 0..11 were released, 3, 4 and 9 handed back
    store.queued.append(replace(job(total=30, dispatched_upto=12), pauses=1, returned=True))
    store.outcomes["job1"] = {0, 1, 2, 5, 6, 7, 8, 10, 11}
    store.returned["job1"] = [3, 4, 9]
    dispatcher = make_dispatcher(store, recorder)

    assert await dispatcher.claim() == 1

    sent = recorder.indexes()
    assert sent[0] == [3, 4, 9]
    assert [i for part in sent[1:] for i in part] == list(range(12, 20))  # then the window
    assert {task.pauses for task, _ in recorder.tasks} == {1}
    assert ("take_returned", OWNER, "job1") in store.calls

    await dispatcher.renew()  # the job says no more are waiting: nothing is taken again
    assert [c for c in store.calls if c[0] == "take_returned"] == [("take_returned", OWNER, "job1")]


async def test_a_budgeted_job_releases_what_its_budget_pays_for() -> None:
    store, recorder = FakeDispatchStore(), Recorder()
    row = row_estimate(len(messages_json(0)), PRICE)
    store.queued.append(replace(job(total=100), budget_usd=6.5 * row))
    dispatcher = make_dispatcher(store, recorder, window=40)

    assert await dispatcher.claim() == 1

    assert recorder.flat("job1") == list(range(6))
    assert store.advanced == [("job1", 6)]
