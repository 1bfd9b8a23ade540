"""The ``relay batch`` progress line, rate, ETA and error line (no servers)."""

from __future__ import annotations

import argparse
import io

import pytest

from relay_batches.services.relay_cli.batch import UsageError, status, watch_job
from relay_batches.services.relay_cli.client import ApiFailure
from relay_batches.services.relay_cli.progress import (
    EXIT_COMPLETED,
    EXIT_JOB_ENDED_OTHERWISE,
    EXIT_ROWS_FAILED,
    RateMeter,
    bar,
    clock,
    eta_seconds,
    exit_code,
    job_duration_s,
    money,
    progress_line,
    status_text,
    summary_line,
)
from relay_batches.settings import ClientSettings, ConfigError


def batch(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "id": "a" * 32,
        "status": "running",
        "total": 1000,
        "completed": 398,
        "failed": 2,
        "dead_letter": 1,
    }
    return {**base, **fields}


def test_rate_over_the_window_and_eta() -> None:
    meter = RateMeter(window_s=10)
    assert meter.rate() is None
    meter.observe(0.0, 0)
    assert meter.rate() is None
    meter.observe(2.0, 20)
    assert meter.rate() == pytest.approx(10.0)
    for t in range(3, 40):
        meter.observe(float(t), 20 + (t - 2) * 50)  # faster now
    assert meter.rate() == pytest.approx(50.0)
    assert eta_seconds(500, 50.0) == pytest.approx(10.0)
    assert eta_seconds(500, None) is None
    assert eta_seconds(500, 0.0) is None
    assert eta_seconds(0, None) == 0.0


def test_clock_and_bar() -> None:
    assert clock(None) == "--:--"
    assert clock(4.4) == "0:04"
    assert clock(247) == "4:07"
    assert clock(3 * 3600 + 5 * 60 + 9) == "3:05:09"
    assert bar(0.0, 10) == "[..........]"
    assert bar(0.45, 10) == "[####......]"
    assert bar(1.0, 10) == "[##########]"
    assert bar(1.5, 10) == "[##########]"


def test_progress_line() -> None:
    line = progress_line(batch(), 12.5)
    assert line.startswith("[############..................]  40%  400/1000  failed 2")
    assert line.endswith("12.5 rows/s  ETA 0:48  cost $0.00  running")
    assert progress_line(batch(failed=0, completed=0), None).endswith(
        "0/1000  --- rows/s  ETA --:--  cost $0.00  running"
    )
    priced = progress_line(batch(cost_usd=0.0123, budget_usd=5), 1.0)
    assert priced.endswith("ETA 10:00  cost $0.0123 of $5.00 budget  running")
    assert " 100%  0/0 " in progress_line(batch(total=0, completed=0, failed=0), None)


ENDED = {
    "created_at": "2030-01-01T12:00:00Z",
    "started_at": "2030-01-01T12:00:05Z",
    "completed_at": "2030-01-01T12:00:55Z",
}


def test_summary_line_gives_the_jobs_own_duration_and_its_failed_rows() -> None:
    assert summary_line(batch(status="completed", **ENDED)) == (
        f"{'a' * 32} completed · 2 failed: 1000 rows, 398 ok, 2 failed, 1 dead letter in 0:50,"
        " cost $0.00"
    )
    never_started = {**ENDED, "started_at": None}
    line = summary_line(batch(status="failed", cost_usd=2.5, budget_usd=2.5, **never_started))
    assert line.endswith("in 0:55, cost $2.50 of $2.50 budget")
    assert summary_line(batch(status="canceled", failed=0)).startswith(f"{'a' * 32} canceled: ")
    assert " in --:--, " in summary_line(batch(status="canceled", failed=0))


def test_status_text_and_exit_codes() -> None:
    assert status_text(batch(status="completed", failed=8)) == "completed · 8 failed"
    assert status_text(batch(status="completed", failed=0)) == "completed"
    assert exit_code(batch(status="completed", failed=0)) == EXIT_COMPLETED == 0
    assert exit_code(batch(status="completed", failed=8)) == EXIT_ROWS_FAILED == 3
    for ended in ("failed", "canceled", "expired"):
        assert exit_code(batch(status=ended, failed=0)) == EXIT_JOB_ENDED_OTHERWISE == 4
    assert job_duration_s(batch(**ENDED)) == 50.0
    assert job_duration_s(batch(created_at="2030-01-01T12:00:00Z", completed_at=None)) is None


def test_money_shows_cents_or_three_significant_digits_below_a_dollar() -> None:
    assert money(None) == "-"
    assert money(0) == "$0.00"
    assert money(12.345) == "$12.35"
    assert money(1) == "$1.00"
    assert money(0.5) == "$0.500"
    assert money(0.0123) == "$0.0123"
    assert money(0.000123) == "$0.000123"
    assert money(0.0000000016) == "$0.000000002"  # nine digits at most (COST_DIGITS)


def test_api_failure_is_one_line() -> None:
    failure = ApiFailure("invalid API key", 401, "authentication_error")
    assert failure.line() == "invalid API key (401 authentication_error)"
    failure = ApiFailure("model 'x' is unknown", 400, "invalid_request_error", "model")
    assert failure.line() == "model 'x' is unknown (400 invalid_request_error, param model)"
    assert ApiFailure("cannot reach http://x: refused").line() == "cannot reach http://x: refused"


def test_client_settings_from_env() -> None:
    assert ClientSettings.from_env({}) == ClientSettings("http://127.0.0.1:8080", None, 60.0)
    env = {"RELAY_URL": "http://api:9", "RELAY_API_KEY": "rk_1", "RELAY_CLI_TIMEOUT_S": "5"}
    assert ClientSettings.from_env(env) == ClientSettings("http://api:9", "rk_1", 5.0)
    with pytest.raises(ConfigError):
        ClientSettings.from_env({"RELAY_CLI_TIMEOUT_S": "0"})


class FakeClient:
    """Answers ``get`` with one batch object after another (the last one repeats)."""

    def __init__(self, *states: dict[str, object]) -> None:
        self.states = list(states)

    async def get(self, batch_id: str) -> dict[str, object]:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


async def test_watch_redraws_one_line_on_a_terminal_and_exits_zero_when_completed() -> None:
    client = FakeClient(
        batch(status="queued", completed=0, failed=0),
        batch(completed=500, failed=0),
        batch(status="completed", completed=1000, failed=0),
    )
    err = Terminal()
    code = await watch_job(client, "a" * 32, 0.001, err)  # type: ignore[arg-type]
    assert code == 0
    drawn = err.getvalue()
    assert drawn.count("\r") == 3 and drawn.count("\x1b[K") == 3
    assert "  50%  500/1000" in drawn
    assert drawn.splitlines()[-1].startswith(f"{'a' * 32} completed: 1000 rows")


@pytest.mark.parametrize("final", ["failed", "canceled", "expired"])
async def test_watch_prints_changes_only_off_a_terminal_and_fails_unless_completed(
    final: str,
) -> None:
    same = batch(completed=10, failed=0)
    client = FakeClient(same, same, same, batch(status=final, completed=10, failed=0))
    err = io.StringIO()
    assert await watch_job(client, "a" * 32, 0.001, err) == 4  # type: ignore[arg-type]
    lines = err.getvalue().splitlines()
    assert len(lines) == 4  # running once, the final state, the summary, the exit code
    assert lines[1].endswith(final) and lines[2].startswith(f"{'a' * 32} {final}:")
    assert lines[3] == "relay: exit 4 (the job failed, was canceled or expired)"


async def test_watch_of_a_job_completed_with_failed_rows_exits_3_and_names_them() -> None:
    client = FakeClient(batch(status="completed", completed=992, failed=8, **ENDED))
    err = io.StringIO()
    assert await watch_job(client, "a" * 32, 0.001, err) == 3  # type: ignore[arg-type]
    lines = err.getvalue().splitlines()
    assert lines[-3].startswith(f"{'a' * 32} completed · 8 failed: 1000 rows, 992 ok, 8 failed")
    assert lines[-3].endswith("in 0:50, cost $0.00")
    assert lines[-2] == f"relay: 8 row(s) failed: relay batch results {'a' * 32} --failed"
    assert lines[-1] == "relay: exit 3 (the job completed, but rows failed)"


async def test_watch_refuses_a_cron_template() -> None:
    client = FakeClient(batch(status="scheduled"))
    with pytest.raises(UsageError, match="cron template"):
        await watch_job(client, "a" * 32, 0.001, io.StringIO())  # type: ignore[arg-type]


async def test_status_of_an_expired_job_shows_its_deadline_and_metadata() -> None:
    expired = batch(
        status="expired",
        name="nightly",
        model="gpt-4o-mini",
        priority=0,
        completed=120,
        failed=0,
        dead_letter=0,
        created_at="2030-01-01T12:00:00Z",
        started_at="2030-01-01T12:00:01Z",
        completed_at="2030-01-01T12:05:00Z",
        expires_at="2030-01-01T12:05:00Z",
        metadata={"team": "search"},
        error=None,
    )
    out = io.StringIO()
    args = argparse.Namespace(id="a" * 32, json=False)
    assert await status(FakeClient(expired), args, out, io.StringIO()) == 0  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    assert "status    expired" in lines
    assert "expires   2030-01-01T12:05:00Z" in lines
    assert 'metadata  {"team":"search"}' in lines
