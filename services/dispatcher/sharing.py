"""How one dispatcher sizes its broker window and shares it and its slots, as pure functions.

- **The window grows with the fleet, one budget per dispatcher**: the dispatcher's
  grown total is twice the rows the live row-workers run at once (their concurrency, as
  their heartbeats report it) divided by the live dispatchers (the distinct owners the
  heartbeats' delivery marks name, this one included), at least ``RELAY_DISPATCH_WINDOW``
  and at most ``RELAY_DISPATCH_WINDOW_MAX`` rows; the workspaces it releases for split
  that total, each getting at least ``RELAY_DISPATCH_WINDOW``. The byte window grows by
  the same factor from ``RELAY_DISPATCH_WINDOW_BYTES``, its total at most
  ``RELAY_DISPATCH_WINDOW_MAX_BYTES``, each workspace at least the base. So with ``D``
  dispatchers and ``W`` workspaces each the broker holds at most
  ``D * max(W * base, max)`` rows (and bytes likewise).
- **Across workspaces** the window is shared: each workspace's releasing jobs split one
  window of rows and one of message bytes between them, so a workspace running many
  jobs has no more rows nor bytes queued in the broker than one running a single job
  (the slots themselves go round the workspaces in the ledger's claim,
  :mod:`relay_batches.ledger.dispatch`).
- **Within a workspace** priority decides: only the workspace's highest-priority jobs
  that still have rows to release are topped up; lower ones wait, keeping their lease,
  until those have released every row.
- **A new tenant** (a job of a workspace with no row in flight here while others have
  some) sends as many rows as they have in flight one level above theirs, so its first
  rows do not wait behind another workspace's window.
- **A job that overtakes** lower jobs of its workspace whose rows are still queued in the
  broker sends as many rows one broker level above theirs, so it starts at once instead
  of queueing behind them; afterwards its rows go at the base level, the same for every
  workspace, so priority never lets one workspace's rows overtake another's for long.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay_batches.ledger.dispatch import RunningJob

if TYPE_CHECKING:
    from relay_batches.services.dispatcher.state import OwnedJob


FLEET_FACTOR = 2  # rows in the broker per row the live row-workers run at once


@dataclass(frozen=True)
class Windows:
    """A dispatcher's window bounds: ``base`` rows and ``base_bytes`` per workspace, the
    total growing with the fleet up to ``max_rows`` and ``max_bytes``."""

    base: int
    base_bytes: int
    max_rows: int
    max_bytes: int

    def for_fleet(
        self, concurrency: int, dispatchers: int = 1, workspaces: int = 1
    ) -> tuple[int, int]:
        """``(rows, bytes)`` of one workspace's window while the live row-workers run
        ``concurrency`` rows at once, ``dispatchers`` dispatchers share them and this one
        releases for ``workspaces`` workspaces: the total rows ``clamp(FLEET_FACTOR *
        concurrency // dispatchers, base, max_rows)`` and the total bytes ``base_bytes``
        grown by the same factor up to ``max_bytes``, each split evenly between the
        workspaces, never below either base."""
        grown = FLEET_FACTOR * concurrency // max(1, dispatchers)
        rows = max(self.base, min(grown, self.max_rows))
        size = max(self.base_bytes, min(self.base_bytes * rows // self.base, self.max_bytes))
        sharing = max(1, workspaces)
        return max(self.base, rows // sharing), max(self.base_bytes, size // sharing)


def releasing(workspace_jobs: list[OwnedJob]) -> list[OwnedJob]:
    """The jobs of one workspace that may release rows: those at the highest priority
    among the jobs with rows left to release (all of them if none has)."""
    pending = [o.job.priority for o in workspace_jobs if not o.exhausted]
    if not pending:
        return list(workspace_jobs)
    top = max(pending)
    return [o for o in workspace_jobs if o.job.priority >= top]


def window_share(window: int, slice_rows: int, workspace_jobs: list[OwnedJob]) -> int:
    """One releasing job's part of its workspace's window, never less than one slice (a
    window smaller than a slice would release nothing)."""
    sharing = sum(1 for o in releasing(workspace_jobs) if not o.exhausted)
    whole = max(window, slice_rows)
    return max(slice_rows, -(-whole // max(1, sharing)))


def byte_share(window_bytes: int, workspace_jobs: list[OwnedJob]) -> int:
    """One releasing job's part of its workspace's byte window: the workspace's jobs that
    still release rows split ``RELAY_DISPATCH_WINDOW_BYTES`` between them (a job with
    nothing in flight still sends one row, however small its part, see
    :func:`~relay_batches.services.dispatcher.state.byte_window_end`)."""
    sharing = sum(1 for o in releasing(workspace_jobs) if not o.exhausted)
    return max(1, window_bytes // max(1, sharing))


def boost_for(new: OwnedJob, workspace_jobs: list[OwnedJob]) -> tuple[int, int]:
    """``(level, rows)`` for a job joining ``workspace_jobs``: one level above the lower
    jobs' rows that may still be queued (a job whose boost is spent sends at level 0),
    for as many rows as they have in flight; ``(0, 0)`` when it overtakes nothing."""
    lower = [o for o in workspace_jobs if o.job.priority < new.job.priority and o.in_flight > 0]
    return above(lower)


def newcomer_boost(new: OwnedJob, jobs: Iterable[OwnedJob]) -> tuple[int, int]:
    """``(level, rows)`` for a job of a workspace with no row in flight here while other
    workspaces have some: one level above their rows that may still be queued, for as
    many rows as they have in flight, so a new tenant's first rows do not queue behind
    another's window; ``(0, 0)`` otherwise."""
    others = [o for o in jobs if o is not new and o.in_flight > 0]
    if any(o.job.workspace_id == new.job.workspace_id for o in others):
        return 0, 0
    return above(others)


def above(jobs: list[OwnedJob]) -> tuple[int, int]:
    """``(level, rows)`` that overtake ``jobs``' rows in flight: one level above the
    highest they go at, for as many rows as they have out; ``(0, 0)`` for no job."""
    if not jobs:
        return 0, 0
    return 1 + max(current_level(o) for o in jobs), sum(o.in_flight for o in jobs)


def current_level(owned: OwnedJob) -> int:
    """The broker level ``owned``'s next rows go at: its boost level while the boost
    lasts, else 0."""
    return owned.level if owned.boost > 0 else 0


def outranking_floors(jobs: Iterable[RunningJob]) -> dict[str, int]:
    """The highest priority among ``jobs`` of each workspace: a queued job above it
    outranks every job of its workspace that we run."""
    floors: dict[str, int] = {}
    for job in jobs:
        floors[job.workspace_id] = max(job.priority, floors.get(job.workspace_id, job.priority))
    return floors
