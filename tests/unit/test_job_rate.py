"""A running job's recent rate and ETA on the batch object (docs/guides/operating.md):
the aggregator's last measured window, or the rate since the current window began when
that measurement is missing or stale; nothing while the job is not running."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from relay_batches.model import RATE_WINDOW_S, JobStatus, recent_rate, shown
from tests.helpers.fakes import BATCH

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
JOB = replace(
    BATCH, status=JobStatus.RUNNING, total=1000, completed=300, failed=100, completed_at=None
)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def test_a_fresh_measurement_is_the_rate() -> None:
    job = replace(JOB, rate_rows_per_s=20.0, rate_window_at=ago(3), rate_window_done=380)
    assert job.rows_per_s(NOW) == 20.0
    assert job.eta_s(NOW) == 30  # 600 rows left at 20/s
    body = job.to_api(NOW)
    assert (body["rows_per_s"], body["eta_s"]) == (20.0, 30)


def test_a_stale_measurement_gives_way_to_the_rate_since_the_window_began() -> None:
    # No chunk closed a window for 4 windows: 40 rows in 20 s since it began.
    job = replace(
        JOB, rate_rows_per_s=50.0, rate_window_at=ago(4 * RATE_WINDOW_S), rate_window_done=360
    )
    assert job.rows_per_s(NOW) == 2.0
    assert job.eta_s(NOW) == 300


def test_without_a_measurement_the_current_window_counts_after_a_second() -> None:
    assert recent_rate(None, ago(0.5), 390, 400, NOW) is None
    assert recent_rate(None, ago(2), 390, 400, NOW) == 5.0
    assert recent_rate(None, None, 0, 400, NOW) is None


def test_a_stalled_job_has_no_eta() -> None:
    job = replace(JOB, rate_rows_per_s=None, rate_window_at=ago(30), rate_window_done=400)
    assert job.rows_per_s(NOW) == 0.0
    assert job.eta_s(NOW) is None


def test_no_rate_or_eta_unless_running() -> None:
    measured = replace(JOB, rate_rows_per_s=20.0, rate_window_at=ago(1), rate_window_done=390)
    for status in (JobStatus.PAUSED, JobStatus.QUEUED, JobStatus.COMPLETED):
        body = replace(measured, status=status).to_api(NOW)
        assert (body["rows_per_s"], body["eta_s"]) == (None, None)


def test_costs_and_rates_are_shown_to_significant_digits_not_decimals() -> None:
    assert shown(1.5375e-06) == 1.5375e-06  # a millionth of a cent keeps its digits
    assert shown(0.1 + 0.2) == 0.3  # a float sum's noise goes
    slow = replace(JOB, rate_rows_per_s=0.00040004, rate_window_at=ago(1), rate_window_done=400)
    body = slow.to_api(NOW)
    assert body["rows_per_s"] == 0.0004
    assert body["eta_s"] == 1_500_000  # 600 rows at the rate shown
    assert replace(JOB, cost_usd=1537.5e-9 * 1000).to_api(NOW)["cost_usd"] == 0.0015375
