"""The progress line of ``relay batch watch``: bar, percent, rate, ETA and cost (pure
functions).

Rate is rows with an outcome per second over a sliding window of recent observations,
so it follows the job's current speed; ETA is the rows left at that rate.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

BAR_WIDTH = 30
RATE_WINDOW_S = 15.0

# The exit codes of ``watch``, ``submit --wait`` and ``retry --wait`` (docs/guides/cli.md);
# with several jobs the highest wins.
EXIT_COMPLETED = 0  # every job completed, no row failed
EXIT_ROWS_FAILED = 3  # every job completed, but some rows failed
EXIT_JOB_ENDED_OTHERWISE = 4  # a job failed, was canceled or expired


def exit_code(batch: dict[str, Any]) -> int:
    """The exit code a watched job ends with: :data:`EXIT_COMPLETED`,
    :data:`EXIT_ROWS_FAILED` or :data:`EXIT_JOB_ENDED_OTHERWISE`."""
    if batch["status"] != "completed":
        return EXIT_JOB_ENDED_OTHERWISE
    return EXIT_ROWS_FAILED if int(batch["failed"]) else EXIT_COMPLETED


def status_text(batch: dict[str, Any]) -> str:
    """The status as a person reads it: ``completed``, or ``completed · 8 failed`` when
    rows failed (whatever the status), so a job with failures never reads as clean."""
    failed = int(batch.get("failed") or 0)
    return f"{batch['status']} · {failed} failed" if failed else str(batch["status"])


def _moment(text: object) -> datetime | None:
    return datetime.fromisoformat(text) if isinstance(text, str) and text else None


def job_duration_s(batch: dict[str, Any]) -> float | None:
    """How long the job ran, from its own timestamps: from ``started_at`` (or
    ``created_at`` for a job that never started) to ``completed_at``; None before it
    ends."""
    end = _moment(batch.get("completed_at"))
    start = _moment(batch.get("started_at")) or _moment(batch.get("created_at"))
    if end is None or start is None:
        return None
    return max(0.0, (end - start).total_seconds())


@dataclass
class RateMeter:
    """Rows per second from ``(seconds, rows done)`` observations."""

    window_s: float = RATE_WINDOW_S
    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def observe(self, now: float, done: int) -> None:
        """Record that ``done`` rows had an outcome at time ``now`` (monotonic seconds)."""
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window_s:
            self.samples.popleft()

    def rate(self) -> float | None:
        """Rows per second over the window; None until two observations apart in time."""
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        if t1 <= t0:
            return None
        return max(0.0, (d1 - d0) / (t1 - t0))


def done_rows(batch: dict[str, Any]) -> int:
    """Rows with an outcome: ``completed + failed``."""
    return int(batch["completed"]) + int(batch["failed"])


def eta_seconds(remaining: int, rate: float | None) -> float | None:
    """Seconds to finish ``remaining`` rows at ``rate``; None when unknown."""
    if remaining <= 0:
        return 0.0
    if not rate:
        return None
    return remaining / rate


def clock(seconds: float | None) -> str:
    """``1:05:09``, ``4:07`` or ``--:--`` for unknown."""
    if seconds is None:
        return "--:--"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """``[#########.....................]`` for ``fraction`` in 0..1."""
    filled = min(width, max(0, int(fraction * width)))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def percent_bar(batch: dict[str, Any]) -> str:
    """``[############..................]  40%  400/1000``."""
    total = int(batch["total"])
    done = done_rows(batch)
    fraction = done / total if total else 1.0
    return f"{bar(fraction)} {int(fraction * 100):3d}%  {done}/{total}"


def money(usd: float | None) -> str:
    """``$0.00``, ``$12.34``, or three significant digits below a dollar: ``$0.000123``."""
    if usd is None:
        return "-"
    if usd == 0:
        return "$0.00"
    digits = 2 if abs(usd) >= 1 else min(9, 2 - math.floor(math.log10(abs(usd))))
    return f"${usd:.{digits}f}"


def cost_text(batch: dict[str, Any]) -> str:
    """``$0.0123`` or, with a budget, ``$0.0123 of $5.00 budget``."""
    cost = money(float(batch.get("cost_usd") or 0))
    budget = batch.get("budget_usd")
    return f"{cost} of {money(float(budget))} budget" if budget else cost


def progress_line(batch: dict[str, Any], rate: float | None) -> str:
    """``[####......]  40%  400/1000  failed 2  12.5 rows/s  ETA 0:48  cost $0.0123  running``."""
    failed = f"  failed {batch['failed']}" if batch["failed"] else ""
    speed = "--- rows/s" if rate is None else f"{rate:.1f} rows/s"
    eta = clock(eta_seconds(int(batch["total"]) - done_rows(batch), rate))
    cost = f"cost {cost_text(batch)}"
    return f"{percent_bar(batch)}{failed}  {speed}  ETA {eta}  {cost}  {batch['status']}"


def summary_line(batch: dict[str, Any]) -> str:
    """The final line: ``<id> completed · 2 failed: 1000 rows, 998 ok, 2 failed, 0 dead
    letter in 0:42, cost $0.0123``; the time is the job's own (:func:`job_duration_s`)."""
    return (
        f"{batch['id']} {status_text(batch)}: {batch['total']} rows, {batch['completed']} ok,"
        f" {batch['failed']} failed, {batch['dead_letter']} dead letter"
        f" in {clock(job_duration_s(batch))}, cost {cost_text(batch)}"
    )
