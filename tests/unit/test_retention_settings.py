"""Retention without servers: the duration grammar, ``RELAY_RETENTION`` and its interval,
the CLI's retention argument, the per-transaction row budget, and a reaper pass over a
fake ledger (it stops when nothing is due and counts what it purged)."""

from __future__ import annotations

import argparse
from datetime import timedelta

import pytest

from relay_batches.durations import format_duration, parse_duration
from relay_batches.ledger.retention import Purged, PurgedOffloads, _Claimed, within_budget
from relay_batches.metrics import (
    RETENTION_JOBS_PURGED,
    RETENTION_OFFLOADS_PURGED,
    RETENTION_ROWS_PURGED,
)
from relay_batches.services.relay_cli.__main__ import _retention
from relay_batches.services.scheduler.retention import KEYS_PAGE, Purger
from relay_batches.settings import ConfigError, Settings
from tests.helpers.config import config_error


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5s", timedelta(seconds=5)),
        ("90m", timedelta(minutes=90)),
        ("12h", timedelta(hours=12)),
        ("30d", timedelta(days=30)),
        ("0s", timedelta(0)),
    ],
)
def test_durations_are_parsed(text: str, expected: timedelta) -> None:
    assert parse_duration(text, 6) == expected


@pytest.mark.parametrize(
    "text", ["", "d", "30", "3w", "-5s", "+5s", " 5s", "5 s", "1.5h", "5S", "٣d"]
)
def test_anything_else_is_not_a_duration(text: str) -> None:
    assert parse_duration(text, 6) is None


def test_durations_are_written_in_their_largest_whole_unit() -> None:
    assert [
        format_duration(parse_duration(t, 6) or timedelta(0)) for t in ("7d", "36h", "90m", "61s")
    ] == ["7d", "36h", "90m", "61s"]
    assert format_duration(timedelta(hours=48)) == "2d"


def test_too_many_digits_is_not_a_duration() -> None:
    assert parse_duration("1234567s", 6) is None
    assert parse_duration("123456s", 6) == timedelta(seconds=123456)


def test_retention_defaults_to_30_days_and_a_minute_between_passes() -> None:
    settings = Settings.from_env({"RELAY_RETENTION": ""})
    assert settings.retention == timedelta(days=30)
    assert settings.retention_interval_s == 60.0


def test_retention_and_its_interval_are_read() -> None:
    env = {"RELAY_RETENTION": "12h", "RELAY_RETENTION_INTERVAL_S": "0.5"}
    settings = Settings.from_env(env)
    assert settings.retention == timedelta(hours=12)
    assert settings.retention_interval_s == 0.5
    assert Settings.from_env({"RELAY_RETENTION": "5s"}).retention == timedelta(seconds=5)
    assert settings.describe()["retention"] == 43200.0


@pytest.mark.parametrize("raw", ["3w", "0s", "30", "-1d", "1234567d"])
def test_a_bad_retention_stops_start_up_with_one_line(raw: str) -> None:
    assert config_error(Settings.from_env, {"RELAY_RETENTION": raw}) == (
        f"RELAY_RETENTION must be a duration above 0 (<n>s, <n>m, <n>h or <n>d), got {raw!r}"
    )


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "x"])
def test_a_bad_retention_interval_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"^RELAY_RETENTION_INTERVAL_S must be a"):
        Settings.from_env({"RELAY_RETENTION_INTERVAL_S": raw})


def test_the_cli_takes_a_duration_or_default() -> None:
    assert _retention("7d") == timedelta(days=7)
    assert _retention("default") is None
    with pytest.raises(argparse.ArgumentTypeError, match="7d"):
        _retention("a week")


def _jobs(*totals: int) -> list[_Claimed]:
    return [_Claimed(f"b{i}", "w", total) for i, total in enumerate(totals)]


def test_a_transaction_takes_jobs_while_their_rows_fit() -> None:
    claimed = _jobs(3, 3, 3)
    assert within_budget(claimed, 7) == claimed[:2]
    assert within_budget(claimed, 9) == claimed
    assert within_budget(_jobs(100, 1), 7) == _jobs(100)  # one larger job goes alone
    assert within_budget([], 7) == []


class FakeLedger:
    """Due jobs handed out ``per_call`` at a time, provider batch records as ``offloads``
    says (then none), and expired keys a page at a time."""

    def __init__(self, jobs: int, per_call: int, keys: int, offloads: list[PurgedOffloads]) -> None:
        self.jobs, self.per_call, self.keys = jobs, per_call, keys
        self.offloads = offloads
        self.job_calls = self.key_calls = self.offload_calls = 0

    async def purge_jobs(self) -> Purged:
        self.job_calls += 1
        taken = min(self.per_call, self.jobs)
        self.jobs -= taken
        return Purged(taken, taken * 10)

    async def purge_offload_batches(self) -> PurgedOffloads:
        self.offload_calls += 1
        return self.offloads.pop(0) if self.offloads else PurgedOffloads(0, 0)

    async def purge_idempotency_keys(self, limit: int) -> int:
        self.key_calls += 1
        taken = min(limit, self.keys)
        self.keys -= taken
        return taken


async def test_a_pass_purges_until_nothing_is_due_and_counts_it() -> None:
    offloads = [PurgedOffloads(0, 2), PurgedOffloads(2, 1)]
    ledger = FakeLedger(jobs=7, per_call=3, keys=KEYS_PAGE + 1, offloads=offloads)
    jobs_before = RETENTION_JOBS_PURGED._value.get()
    offloads_before = RETENTION_OFFLOADS_PURGED._value.get()
    rows_before = RETENTION_ROWS_PURGED._value.get()

    assert await Purger(ledger).purge_pass() == Purged(7, 70)

    assert (ledger.job_calls, ledger.jobs) == (4, 0)  # 3 + 3 + 1, then one that finds none
    assert (ledger.key_calls, ledger.keys) == (2, 0)
    assert ledger.offload_calls == 3  # detached only, then deleted, then none left
    assert RETENTION_OFFLOADS_PURGED._value.get() - offloads_before == 2
    assert RETENTION_JOBS_PURGED._value.get() - jobs_before == 7
    assert RETENTION_ROWS_PURGED._value.get() - rows_before == 70
