"""Cron ticks in UTC: the one place that asks croniter when a template runs.

Used by ingest-api (a new template's first ``next_run_at``) and the scheduler (which
tick is due, when the next one falls), so both always agree.
"""

from __future__ import annotations

from datetime import UTC, datetime

from croniter import croniter


def latest_tick(expr: str, now: datetime) -> datetime:
    """The latest tick of ``expr`` at or before ``now`` (UTC)."""
    previous = croniter(expr, now).get_prev(datetime)
    following = croniter(expr, previous).get_next(datetime)
    return (following if following <= now else previous).astimezone(UTC)


def next_tick(expr: str, now: datetime) -> datetime:
    """The first tick of ``expr`` strictly after ``now`` (UTC)."""
    return croniter(expr, now).get_next(datetime).astimezone(UTC)
