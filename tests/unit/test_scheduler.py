"""Unit tests of the scheduler's pure parts: ticks, plans, sleeps, its wake-up message,
and the reaper's announcements on an in-memory expiry ledger."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from relay_batches.bus.topology import EVENT_CANCELED, EVENT_FINISHED
from relay_batches.ledger.expiry import ExpiredJob
from relay_batches.ledger.schedule import DueTemplate, PlannedTick
from relay_batches.messages import JobEvent, MessageError, TemplateCreated
from relay_batches.model import JobStatus
from relay_batches.services.scheduler.core import (
    EXPIRY_PAGE,
    Reaper,
    plan_ticks,
    run_name,
    sleep_seconds,
)


def at(hh: int, mm: int, ss: int = 0, us: int = 0) -> datetime:
    return datetime(2030, 3, 4, hh, mm, ss, us, tzinfo=UTC)


def test_a_backlog_of_missed_ticks_plans_one_run_for_the_latest() -> None:
    template = DueTemplate("t1", "hourly report", "*/5 * * * *", at(10, 0))
    [planned] = plan_ticks([template], at(12, 7, 30))
    assert planned == PlannedTick(
        "t1", "hourly report @ 2030-03-04T12:05:00Z", at(12, 5), at(12, 10)
    )


def test_one_plan_per_due_template() -> None:
    due = [
        DueTemplate("a", "a", "* * * * *", at(12, 5)),
        DueTemplate("b", "b", "0 * * * *", at(12, 0)),
    ]
    planned = plan_ticks(due, at(12, 5, 1))
    assert [(p.template_id, p.tick, p.next_run_at) for p in planned] == [
        ("a", at(12, 5), at(12, 6)),
        ("b", at(12, 0), at(13, 0)),
    ]


def test_run_name_carries_the_tick() -> None:
    assert run_name("Nightly", at(3, 0)) == "Nightly @ 2030-03-04T03:00:00Z"


@pytest.mark.parametrize(
    ("wake_at", "expected"),
    [
        (None, 60.0),  # no template at all: the cap
        (at(12, 0, 10), 10.0),
        (at(11, 59), 0.0),  # already due
        (at(14, 0), 60.0),  # far away: capped
    ],
)
def test_sleep_until_the_next_tick_capped(wake_at: datetime | None, expected: float) -> None:
    assert sleep_seconds(wake_at, at(12, 0), cap=60.0) == expected


def test_sleep_is_never_negative_or_uncapped() -> None:
    now = at(12, 0)
    for offset in (-3600, -1, 0, 1, 59, 61, 86400):
        delay = sleep_seconds(now + timedelta(seconds=offset), now, cap=60.0)
        assert 0.0 <= delay <= 60.0


def test_template_created_round_trips() -> None:
    message = TemplateCreated("9f2c1b7e4a8d4e51b0c6d3f2a1e5c7b9", "2030-03-04T12:05:00Z")
    assert TemplateCreated.decode(message.encode()) == message


def test_template_created_rejects_other_kinds() -> None:
    with pytest.raises(MessageError):
        TemplateCreated.decode(b'{"v":1,"kind":"dispatch","batch_id":"x","priority":0}')
    with pytest.raises(MessageError):
        TemplateCreated.decode(b'{"v":1,"kind":"template"}')


# --- the reaper -----------------------------------------------------------------------


class DueJobs:
    """An expiry ledger holding ``count`` due jobs, handed out a page at a time."""

    def __init__(self, count: int) -> None:
        self.due = [ExpiredJob(f"{i:032x}", 3, 1, 0) for i in range(count)]
        self.limits: list[int] = []

    async def expire_due(self, limit: int) -> list[ExpiredJob]:
        self.limits.append(limit)
        page, self.due = self.due[:limit], self.due[limit:]
        return page


class Sent:
    """Records what the reaper publishes and marks, in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, object]] = []

    async def publish(self, key: str, body: bytes) -> None:
        self.log.append((key, JobEvent.decode(body)))

    async def mark(self, batch_ids: list[str]) -> None:
        self.log.append(("marked", batch_ids))


async def test_each_expired_job_is_announced_as_a_cancel_then_finished_then_marked() -> None:
    store, sent = DueJobs(1), Sent()
    assert await Reaper(store, sent.publish, sent.mark).expire_pass() == 1
    event = JobEvent("0" * 32, JobStatus.EXPIRED, 3, 1, 0)
    assert sent.log == [
        (EVENT_CANCELED, event),
        (EVENT_FINISHED, event),
        ("marked", ["0" * 32]),
    ]


async def test_a_pass_with_nothing_due_publishes_nothing() -> None:
    store, sent = DueJobs(0), Sent()
    assert await Reaper(store, sent.publish, sent.mark).expire_pass() == 0
    assert sent.log == []
    assert store.limits == [EXPIRY_PAGE]


async def test_a_pass_takes_pages_until_a_short_one() -> None:
    store, sent = DueJobs(EXPIRY_PAGE + 2), Sent()
    assert await Reaper(store, sent.publish, sent.mark).expire_pass() == EXPIRY_PAGE + 2
    assert store.limits == [EXPIRY_PAGE, EXPIRY_PAGE]
    marked = [ids for key, ids in sent.log if key == "marked"]
    assert [len(ids) for ids in marked] == [EXPIRY_PAGE, 2]  # type: ignore[arg-type]
    finished = [e for key, e in sent.log if key == EVENT_FINISHED]
    assert len(finished) == EXPIRY_PAGE + 2
