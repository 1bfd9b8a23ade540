"""Pacing: what a job sends out at once is sized in time, not rows.

A row-worker takes a few slices at once (its prefetch, :func:`rows_prefetch`) and a
dispatcher keeps a window of each workspace's rows in the broker. Counted in rows, both
are seconds of work when rows are fast and minutes when they are slow, and every control
(priority, a new tenant's turn) waits behind them. So the dispatcher learns each job's
upstream time per row (the mean ``latency_ms`` of its recorded outcomes, carried by
``job.progress``) and sizes:

- **slices** so that a worker holds about :data:`SLICE_AHEAD_S` of work beyond the rows
  it runs: ``widest * (1 + SLICE_AHEAD_S / latency) / prefetch`` rows, where ``widest``
  is the largest concurrency among the live row-workers and ``prefetch`` the slices it
  takes at once; never more than ``RELAY_SLICE_ROWS`` (so fast rows keep full slices and
  zero-latency throughput is unchanged), nor fewer than ``widest`` (a worker holding two
  slices of fewer rows than its slots would leave slots idle), nor more than the job's
  rows still to go out spread over the workers (a small job runs on every worker at
  once, and a big one's last rows end on every worker together).
- **the window** of its workspace: what the workers hold at that slice size plus about
  :data:`WINDOW_AHEAD_S` of the live fleet's throughput, split between the live
  dispatchers, never more than the row window of :mod:`.sharing` (the cap when rows are
  fast) nor less than one slice.

A job whose pace is not known yet (no outcome of its own recorded: other jobs of its
model may be much faster) gets the smallest slices and a window of what the workers
hold of them plus one row per slot, until its first outcomes are recorded; at zero
latency that is one round trip.

So a row queued behind another workspace's rows waits about ``WINDOW_AHEAD_S`` in the
broker and ``SLICE_AHEAD_S`` at a worker, at any latency.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from relay_batches.bus.topology import rows_prefetch
from relay_batches.settings import Settings

SLICE_AHEAD_S = 1.0  # work a row-worker holds beyond the rows it runs
WINDOW_AHEAD_S = 2.0  # a workspace's work in the broker beyond what the workers hold
PACE_WEIGHT = 0.3  # the weight of a new reading in a pace (an exponential mean)
PACE_MEMORY = 10_000  # jobs whose pace is remembered; the oldest go first
MIN_LATENCY_S = 0.001  # a reading below this counts as this (no division by zero)
# The fleet assumed while no row-worker has reported yet (a dispatcher just started):
# one worker at RELAY_BATCH_CONCURRENCY's default; it reports within a heartbeat.
UNKNOWN_FLEET = (Settings.batch_concurrency,)


class Paces:
    """The upstream time per row of each job, an exponential mean of the readings its
    progress events carry; bounded memory (the oldest job goes first)."""

    def __init__(self, capacity: int = PACE_MEMORY) -> None:
        self._jobs: OrderedDict[str, float] = OrderedDict()
        self._capacity = capacity

    def observe(self, batch_id: str, latency_ms: float) -> None:
        """Take a reading: rows of ``batch_id`` took ``latency_ms`` (0: none measured)."""
        if latency_ms <= 0:
            return
        seconds = max(MIN_LATENCY_S, latency_ms / 1000)
        old = self._jobs.get(batch_id)
        self._jobs[batch_id] = seconds if old is None else old + PACE_WEIGHT * (seconds - old)
        self._jobs.move_to_end(batch_id)
        while len(self._jobs) > self._capacity:
            self._jobs.popitem(last=False)

    def latency_s(self, batch_id: str) -> float | None:
        """Seconds per row of ``batch_id``, or None while none is measured."""
        return self._jobs.get(batch_id)

    def forget(self, batch_id: str) -> None:
        """The job ended here (or is no longer ours): its pace goes."""
        self._jobs.pop(batch_id, None)


def slice_size(
    latency_s: float | None, concurrencies: Sequence[int], base: int, rows_left: int
) -> int:
    """Rows per slice for a job whose rows take ``latency_s`` (None: unknown) while live
    row-workers run ``concurrencies`` rows at once each and ``rows_left`` of its rows
    are still to go out; ``base`` is ``RELAY_SLICE_ROWS``. With no worker known, as if
    :data:`UNKNOWN_FLEET` ran."""
    concurrencies = concurrencies or UNKNOWN_FLEET
    widest = max(concurrencies)
    floor = min(base, widest)
    if latency_s is None:
        size = floor
    else:
        prefetch = rows_prefetch(widest, base)
        wanted = math.ceil(widest * (1 + SLICE_AHEAD_S / latency_s) / prefetch)
        size = max(floor, min(base, wanted))
    # Rows left over the workers: a small job runs on every worker, and a big one's last
    # rows end on every worker together.
    spread = math.ceil(rows_left / len(concurrencies))
    return max(1, min(size, spread))


def paced_window(
    latency_s: float | None,
    concurrencies: Sequence[int],
    size: int,
    base: int,
    dispatchers: int = 1,
) -> int:
    """A workspace's row window for a job paced at ``latency_s`` with slices of ``size``
    rows: what the live workers hold of such slices (each ``rows_prefetch`` of them,
    sized by ``base``) plus ``WINDOW_AHEAD_S`` of their throughput (one row per slot
    while the pace is unknown), split between ``dispatchers``. With no worker known, as
    if :data:`UNKNOWN_FLEET` ran."""
    concurrencies = concurrencies or UNKNOWN_FLEET
    held = sum(rows_prefetch(c, base) * size for c in concurrencies)
    slots = sum(concurrencies)
    ahead = slots if latency_s is None else math.ceil(slots * WINDOW_AHEAD_S / latency_s)
    return max(size, (held + ahead) // max(1, dispatchers))
