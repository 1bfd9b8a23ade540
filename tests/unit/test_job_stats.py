"""The stats endpoint's rules that need no database: the interval width, the parameters
that choose what results show, and how a row's details are rendered."""

from __future__ import annotations

import pytest

from relay_batches.errors import ApiError
from relay_batches.ledger.job_stats import INTERVALS_S, MAX_INTERVALS, interval_for
from relay_batches.ledger.jobs import DeadLetterRow, ResultRow, RowDetails
from relay_batches.services.ingest_api.surfaces.native.results import (
    dead_letter_object,
    partial_flag,
    row_object,
    wants_details,
)

# An instant on a day boundary (2026-11-04T00:00:00Z), so every width aligns on it.
DAY0 = 1_793_750_400.0


@pytest.mark.parametrize(
    ("first", "last", "width"),
    [
        (DAY0, DAY0, 1),
        (DAY0, DAY0 + 119.99, 1),  # 120 one-second intervals
        (DAY0, DAY0 + 120, 2),  # a 121st would start
        (DAY0 + 0.5, DAY0 + 120.4, 2),  # under 120 s, but on 121 aligned seconds
        (DAY0 + 1, DAY0 + 239.9, 2),  # two-second intervals 0-2 … 238-240: 120
        (DAY0 + 1, DAY0 + 240, 5),  # a 121st would start at 240
        (DAY0, DAY0 + 3600, 60),  # an hour is 61 minute intervals, 121 thirty-second ones
        (DAY0, DAY0 + 7 * 86400, 7200),  # a week: 84 two-hour intervals
        (DAY0, DAY0 + 119 * 86400, 86400),
        (DAY0, DAY0 + 120 * 86400, 2 * 86400),  # past 119 days: whole numbers of days
        (DAY0, DAY0 + 500 * 86400, 5 * 86400),
    ],
)
def test_the_interval_is_the_smallest_width_that_keeps_120_intervals(
    first: float, last: float, width: int
) -> None:
    assert interval_for(first, last) == width


@pytest.mark.parametrize("span", [0.0, 1.5, 59.0, 601.0, 86399.0, 3e6, 9.9e6, 4e7])
def test_every_span_fits_and_no_smaller_width_would(span: float) -> None:
    first = DAY0 + 7.25
    width = interval_for(first, first + span)
    intervals = int((first + span) // width - first // width) + 1
    assert intervals <= MAX_INTERVALS
    smaller = [w for w in INTERVALS_S if w < width]
    assert all(int((first + span) // w - first // w) + 1 > MAX_INTERVALS for w in smaller)


def test_partial_and_include_take_their_values_only() -> None:
    assert [partial_flag(None), partial_flag("true"), partial_flag("false")] == [
        False,
        True,
        False,
    ]
    assert [wants_details(None), wants_details("details")] == [False, True]
    for bad in ("1", "True", "", "yes"):
        with pytest.raises(ApiError) as raised:
            partial_flag(bad)
        assert (raised.value.status, raised.value.param) == (400, "partial")
    for bad in ("", "usage", "details,usage"):
        with pytest.raises(ApiError) as raised:
            wants_details(bad)
        assert (raised.value.status, raised.value.param) == (400, "include")


def test_details_show_cost_only_when_known_and_no_finish_reason_for_an_error() -> None:
    priced = RowDetails(10, 5, 1, "openai-mini", 120, "stop", 0.0000045)
    unpriced = RowDetails(0, 0, 4, None, None, "stop", None)
    assert row_object(ResultRow(0, "a", "hi", None, None, priced)) == {
        "custom_id": "a",
        "content": "hi",
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
        "attempts": 1,
        "deployment": "openai-mini",
        "latency_ms": 120,
        "finish_reason": "stop",
        "cost_usd": 0.0000045,
    }
    assert dead_letter_object(DeadLetterRow(1, "b", "upstream_error: x", 4, unpriced)) == {
        "custom_id": "b",
        "error": "upstream_error: x",
        "attempts": 4,
        "usage": {"prompt_tokens": 0, "completion_tokens": 0},
        "deployment": None,
        "latency_ms": None,
        "finish_reason": None,
    }
    assert row_object(ResultRow(2, "c", "hi", None)) == {"custom_id": "c", "content": "hi"}
