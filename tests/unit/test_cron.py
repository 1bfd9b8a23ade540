"""Unit tests of the shared cron helper (relay_batches.cron), used by ingest-api and scheduler."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from relay_batches import cron
from relay_batches.cron import latest_tick, next_tick
from relay_batches.services.ingest_api import submit
from relay_batches.services.scheduler import core


def at(hh: int, mm: int, ss: int = 0, us: int = 0) -> datetime:
    return datetime(2030, 3, 4, hh, mm, ss, us, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expr", "now", "expected"),
    [
        ("* * * * *", at(12, 5), at(12, 5)),  # exactly on a tick: that tick
        ("* * * * *", at(12, 5, 0, 1), at(12, 5)),
        ("* * * * *", at(12, 5, 59, 999999), at(12, 5)),
        ("*/15 * * * *", at(12, 44, 59), at(12, 30)),
        ("0 9 * * *", at(8, 59), datetime(2030, 3, 3, 9, 0, tzinfo=UTC)),
    ],
)
def test_latest_tick_is_at_or_before_now(expr: str, now: datetime, expected: datetime) -> None:
    assert latest_tick(expr, now) == expected


def test_next_tick_is_strictly_after_now() -> None:
    assert next_tick("* * * * *", at(12, 5)) == at(12, 6)
    assert next_tick("* * * * *", at(12, 5, 30)) == at(12, 6)
    assert next_tick("0 9 * * *", at(9, 0)) == datetime(2030, 3, 5, 9, 0, tzinfo=UTC)


def test_ingest_api_and_scheduler_share_one_cron_helper() -> None:
    # A template's first next_run_at (ingest-api) and its later ones (scheduler) must come
    # from the same code, or the two could disagree about when a template runs.
    assert submit.next_tick is cron.next_tick
    assert core.next_tick is cron.next_tick
    assert core.latest_tick is cron.latest_tick
