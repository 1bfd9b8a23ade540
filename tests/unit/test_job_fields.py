"""The job-level ``completion_window`` and ``metadata`` rules (API.md, "Submit a batch"),
on the pure validation functions."""

from __future__ import annotations

from datetime import timedelta

import pytest

from relay_batches.errors import ApiError
from relay_batches.services.ingest_api.validation import completion_window, validate_metadata


@pytest.mark.parametrize(
    ("text", "window"),
    [
        ("24h", timedelta(hours=24)),
        ("1s", timedelta(seconds=1)),
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("7d", timedelta(days=7)),
        ("168h", timedelta(days=7)),
        ("604800s", timedelta(days=7)),
        ("007s", timedelta(seconds=7)),
    ],
)
def test_completion_window_accepts_durations_from_1s_to_7d(text: str, window: timedelta) -> None:
    assert completion_window(text, "completion_window") == window


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (24, 'completion_window must be a string such as "24h"'),
        (None, 'completion_window must be a string such as "24h"'),
        ("24", "completion_window '24' is not a duration"),
        ("h", "completion_window 'h' is not a duration"),
        ("", "completion_window '' is not a duration"),
        ("24H", "completion_window '24H' is not a duration"),
        ("-5s", "completion_window '-5s' is not a duration"),
        ("+5s", "completion_window '+5s' is not a duration"),
        (" 24h", "completion_window ' 24h' is not a duration"),
        ("1.5h", "completion_window '1.5h' is not a duration"),
        ("２４h", "completion_window '２４h' is not a duration"),
        ("24hours", "completion_window '24hours' is not a duration"),
        ("9999999s", "completion_window '9999999s' is not a duration"),
        ("0s", "completion_window must be from 1s to 7d, got '0s'"),
        ("8d", "completion_window must be from 1s to 7d, got '8d'"),
        ("169h", "completion_window must be from 1s to 7d, got '169h'"),
        ("604801s", "completion_window must be from 1s to 7d, got '604801s'"),
    ],
)
def test_completion_window_refuses_anything_else_naming_the_param(
    value: object, message: str
) -> None:
    with pytest.raises(ApiError) as caught:
        completion_window(value, "completion_window")
    assert caught.value.status == 400
    assert caught.value.param == "completion_window"
    assert caught.value.message.startswith(message)


def test_completion_window_names_the_param_it_is_given() -> None:
    with pytest.raises(ApiError) as caught:
        completion_window("1w", "body.completion_window")
    assert caught.value.param == "body.completion_window"
    assert caught.value.message.startswith("body.completion_window '1w' is not a duration")


def test_metadata_is_stored_as_compact_json_in_the_order_given() -> None:
    assert validate_metadata({"team": "search", "run": "7"}) == '{"team":"search","run":"7"}'


def test_metadata_absent_or_empty_is_none() -> None:
    assert validate_metadata(None) is None
    assert validate_metadata({}) is None


def test_metadata_at_the_limits_is_accepted() -> None:
    pairs = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    assert validate_metadata(pairs) is not None


@pytest.mark.parametrize(
    ("value", "param", "message"),
    [
        (["a"], "metadata", "metadata must be an object of string keys and string values"),
        ("a=b", "metadata", "metadata must be an object of string keys and string values"),
        ({f"k{i}": "v" for i in range(17)}, "metadata", "metadata must have at most 16 pairs"),
        ({"k" * 65: "v"}, "metadata", "metadata keys must be 1 to 64 characters"),
        ({"": "v"}, "metadata", "metadata keys must be 1 to 64 characters"),
        ({"a\x00": "v"}, "metadata", "metadata keys must be 1 to 64 characters"),
        ({"team": 7}, "metadata.team", "metadata.team must be a string"),
        ({"team": None}, "metadata.team", "metadata.team must be a string"),
        ({"team": {"a": "b"}}, "metadata.team", "metadata.team must be a string"),
        ({"team": "v" * 513}, "metadata.team", "metadata.team must be at most 512 characters"),
        ({"team": "a\x00"}, "metadata.team", "metadata.team must be at most 512 characters"),
    ],
)
def test_metadata_refuses_what_openai_refuses(value: object, param: str, message: str) -> None:
    with pytest.raises(ApiError) as caught:
        validate_metadata(value)
    assert caught.value.status == 400
    assert caught.value.param == param
    assert caught.value.message.startswith(message)
