"""Unit tests of the router's retry policy: retryable statuses, Retry-After, backoff."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from relay_batches.router.policy import BackoffPolicy, is_retryable_status, parse_retry_after

NOW = datetime(2026, 10, 4, 9, 12, 44, tzinfo=UTC)


# --- is_retryable_status -----------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 599])
def test_retryable_statuses(status: int) -> None:
    assert is_retryable_status(status) is True


@pytest.mark.parametrize("status", [200, 301, 400, 401, 403, 404, 413, 422, 600])
def test_non_retryable_statuses(status: int) -> None:
    assert is_retryable_status(status) is False


# --- parse_retry_after -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("3", 3.0), ("0", 0.0), ("1.5", 1.5), ("  7 ", 7.0), ("120", 120.0)],
)
def test_retry_after_seconds(value: str, expected: float) -> None:
    assert parse_retry_after(value, now=NOW) == expected


def test_retry_after_negative_seconds_is_zero() -> None:
    assert parse_retry_after("-5", now=NOW) == 0.0


def test_retry_after_http_date_relative_to_now() -> None:
    # NOW + 30 s, written as an IMF-fixdate.
    assert parse_retry_after("Sun, 04 Oct 2026 09:13:14 GMT", now=NOW) == 30.0


def test_retry_after_http_date_in_the_past_is_zero() -> None:
    assert parse_retry_after("Sun, 04 Oct 2026 09:00:00 GMT", now=NOW) == 0.0


def test_retry_after_http_date_uses_given_now_not_the_clock() -> None:
    later = NOW + timedelta(seconds=20)
    assert parse_retry_after("Sun, 04 Oct 2026 09:13:14 GMT", now=later) == 10.0


@pytest.mark.parametrize("value", [None, "", "soon", "Mon, 99 Foo 2026", "12abc", "   "])
def test_retry_after_garbage_is_none(value: str | None) -> None:
    assert parse_retry_after(value, now=NOW) is None


# --- BackoffPolicy -----------------------------------------------------------------------


@pytest.mark.parametrize("retry", [0, 1, 2, 3, 4, 5, 10])
def test_backoff_full_jitter_stays_within_ceiling(retry: int) -> None:
    policy = BackoffPolicy(base_s=0.05, cap_s=1.0)
    ceiling = min(1.0, 0.05 * 2**retry)
    rng = random.Random(1234)
    draws = [policy.delay(retry, rng) for _ in range(2000)]
    assert all(0.0 <= d <= ceiling for d in draws)
    # Full jitter: the draws spread over the whole range, not clustered at the top.
    assert min(draws) < ceiling * 0.05
    assert max(draws) > ceiling * 0.95


def test_backoff_is_deterministic_for_a_seeded_rng() -> None:
    policy = BackoffPolicy()
    first = [policy.delay(n, random.Random(7)) for n in range(6)]
    second = [policy.delay(n, random.Random(7)) for n in range(6)]
    assert first == second


def test_backoff_cap_is_respected_for_large_retries() -> None:
    policy = BackoffPolicy(base_s=1.0, cap_s=2.5)
    rng = random.Random(99)
    draws = [policy.delay(60, rng) for _ in range(1000)]
    assert max(draws) <= 2.5
    assert max(draws) > 2.0


def test_retry_after_wins_over_jitter() -> None:
    policy = BackoffPolicy(base_s=0.05, cap_s=5.0)
    rng = random.Random(0)
    state = rng.getstate()
    assert policy.delay(0, rng, retry_after=3.0) == 3.0
    assert policy.delay(4, rng, retry_after=0.0) == 0.0
    # The rng was not consumed when Retry-After decided.
    assert rng.getstate() == state


def test_retry_after_is_capped() -> None:
    policy = BackoffPolicy(base_s=0.05, cap_s=5.0)
    assert policy.delay(0, random.Random(0), retry_after=3600.0) == 5.0
