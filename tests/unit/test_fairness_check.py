"""The fairness check of the two-workspace chaos round fails on an unfair finish order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.helpers.fairness import assert_served_fairly, finish_order, unfinished_when_done

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LARGE = [f"a{i}" for i in range(8)]
SMALL = ["b0", "b1", "b2"]


def at(order: list[str]) -> dict[str, datetime | None]:
    """Finish times one second apart, in ``order``."""
    return {job: T0 + timedelta(seconds=n) for n, job in enumerate(order)}


def test_a_small_workspace_done_early_is_fair() -> None:
    finished = at(["a0", "b0", "b1", "a1", "b2", *LARGE[2:]])
    assert assert_served_fairly(finished, SMALL, LARGE) == 6
    assert finish_order(finished)[:5] == ["a0", "b0", "b1", "a1", "b2"]


def test_first_come_slots_fail_the_check() -> None:
    with pytest.raises(AssertionError, match="only 0 of the other's 8 jobs"):
        assert_served_fairly(at([*LARGE, *SMALL]), SMALL, LARGE)


def test_a_small_job_left_until_most_of_the_queue_is_done_fails_the_check() -> None:
    finished = at(["b0", "b1", *LARGE[:4], "b2", *LARGE[4:]])
    assert unfinished_when_done(finished, SMALL, LARGE) == 4
    with pytest.raises(AssertionError, match="only 4 of the other's 8 jobs"):
        assert_served_fairly(finished, SMALL, LARGE)


def test_a_job_finished_at_the_same_instant_counts_as_finished() -> None:
    finished = at([*SMALL, *LARGE])
    finished["a0"] = finished["b2"]
    assert unfinished_when_done(finished, SMALL, LARGE) == 7


def test_an_unfinished_job_fails_the_check() -> None:
    finished = at([*SMALL, *LARGE])
    finished["a7"] = None
    with pytest.raises(AssertionError, match="unfinished jobs"):
        assert_served_fairly(finished, SMALL, LARGE)
