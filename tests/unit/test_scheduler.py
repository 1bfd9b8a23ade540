"""Unit tests of the scheduler's pure parts: ticks, plans, sleeps, its wake-up message."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from relay_batches.ledger.schedule import DueTemplate, PlannedTick
from relay_batches.messages import MessageError, TemplateCreated
from relay_batches.services.scheduler.core import plan_ticks, run_name, sleep_seconds


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
