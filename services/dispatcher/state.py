"""What a dispatcher holds and the interfaces it is built from: its config, the
store's interface, the jobs it owns (:class:`OwnedJob`) and :class:`DispatcherState`, the
state its parts (claiming, release, recovery) share; and the two pure cuts of a release
(:func:`slice_rows`, :func:`byte_window_end`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from relay_batches.ledger.dispatch import RunningJob, StalledJob
from relay_batches.ledger.released_rows import ByteWindow
from relay_batches.messages import JobEvent, SliceMessage
from relay_batches.services.dispatcher.budget import PriceOf
from relay_batches.services.dispatcher.inflight import InFlight, SendLog
from relay_batches.services.dispatcher.pacing import Paces
from relay_batches.services.dispatcher.recording import ResultsQueues
from relay_batches.services.dispatcher.sharing import (
    Windows,
)

log = logging.getLogger("relay.dispatcher")


class PublishSlice(Protocol):
    """Publish a slice at its broker priority level (0..max_level, higher first),
    confirmed; ``trace``: the W3C context it
    carries (a traced job's release span), passed only when there is one."""

    def __call__(
        self, job_slice: SliceMessage, level: int, trace: str | None = None
    ) -> Awaitable[None]:
        """Publish ``job_slice`` at ``level``."""
        ...


AnnounceFailed = Callable[[JobEvent], Awaitable[None]]
# ``(ready messages, consumers)`` of each results queue.
QueueState = Callable[[], Awaitable[ResultsQueues]]
# A claimed job's lane plan: the batch deployment to offload it to, or None (fast lanes).
PlanLanes = Callable[[RunningJob], Awaitable[str | None]]
FETCH_SLICES = 16
MAX_SLICE_BYTES = 4 * 1024 * 1024
TOP_UP_FRACTION = 4


def slice_rows(
    rows: list[tuple[int, str]], max_rows: int, max_bytes: int
) -> list[list[tuple[int, str]]]:
    """Consecutive rows cut into slices of at most ``max_rows`` rows and (unless a
    single row is larger) ``max_bytes`` of messages, so no broker message grows huge."""
    slices: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] = []
    size = 0
    for row in rows:
        length = len(row[1])
        if current and (len(current) >= max_rows or size + length > max_bytes):
            slices.append(current)
            current, size = [], 0
        current.append(row)
        size += length
    if current:
        slices.append(current)
    return slices


def byte_window_end(
    in_flight: int, next_rows: Sequence[tuple[int, int]], start: int, end: int, budget: int
) -> int:
    """Where a release of rows ``start..end`` stops so that a job's message text in the
    broker stays within ``budget`` bytes, given ``in_flight`` bytes already out and the
    ``(row_index, size)`` of the rows that would go. ``start`` means the window is full:
    nothing goes while less than a quarter of it is free (few, fuller releases rather
    than one per outcome). With nothing in flight the first row goes even if larger."""
    if in_flight > 0 and budget - in_flight < budget // TOP_UP_FRACTION:
        return start
    total = in_flight
    for index, size in next_rows:
        if total > 0 and total + size > budget:
            return index
        total += size
    return end


class Store(Protocol):
    """What the dispatcher needs of the ledger."""

    async def claim_queued(
        self,
        owner: str,
        limit: int,
        lease_s: float,
        per_workspace: int = 0,
        floors: dict[str, int] | None = None,
    ) -> list[RunningJob]:
        """Claim queued jobs, the workspaces taking turns, none below ``floors``."""

    async def claim_outranking(
        self,
        owner: str,
        floors: dict[str, int],
        limit: int,
        lease_s: float,
        per_workspace: int = 0,
    ) -> list[RunningJob]:
        """Claim queued jobs above the highest priority we run of their workspace."""

    async def claim_expired(self, owner: str, limit: int, lease_s: float) -> list[RunningJob]:
        """Claim running jobs whose lease expired."""

    async def renew(self, owner: str, job_ids: list[str], lease_s: float) -> list[RunningJob]:
        """Renew leases; return the jobs still ours."""

    async def release(self, owner: str, job_ids: list[str]) -> None:
        """Let go of leases."""

    async def fetch_rows(
        self, job_id: str, rows_batch_id: str, start: int, end: int
    ) -> list[tuple[int, str]]:
        """Read input rows that have no outcome yet."""

    async def claim_stalled(
        self,
        owner: str,
        job_ids: list[str],
        stall_s: float,
        settled: Mapping[str, int] | None = None,
    ) -> list[StalledJob]:
        """Our jobs without progress for ``stall_s`` (their stall clock restarts), each
        with its first unfinished row, looked for from its row in ``settled``."""

    async def recording_silences(self) -> dict[str, float]:
        """Per running job with an outcome recorded, the seconds since its latest."""

    async def unfinished_rows(self, job_id: str, start: int, end: int) -> list[int]:
        """Indexes in ``start..end`` without an outcome."""

    async def fetch_rows_at(
        self, job_id: str, rows_batch_id: str, indexes: list[int]
    ) -> list[tuple[int, str]]:
        """Input rows at ``indexes`` that have no outcome yet."""

    async def byte_window(
        self, job_id: str, rows_batch_id: str, settled_below: int, upto: int, end: int
    ) -> ByteWindow:
        """Bytes of messages in flight and the sizes of the next rows."""

    async def advance(self, owner: str, job_id: str, upto: int) -> bool:
        """Record dispatched_upto."""

    async def fail(self, job_id: str, error: str) -> bool:
        """Fail a job as a whole."""

    async def offload(self, owner: str, job_id: str, total: int, deployment: str) -> bool:
        """Mark a job offloaded and release all its rows (once, before any release)."""

    async def take_returned(self, owner: str, job_id: str) -> list[tuple[int, str]]:
        """Take the rows row-workers handed back unstarted, to release them again."""


@dataclass(frozen=True)
class DispatchConfig:
    """Tuning of one dispatcher."""

    owner: str
    window: int
    slice_rows: int
    max_running_jobs: int
    lease_s: float
    stall_s: float = 120.0
    max_running_per_workspace: int = 0
    max_level: int = 9
    window_bytes: int = 16 * 1024 * 1024
    window_max: int = 0  # 0: ``window`` (the window does not grow with the fleet)
    window_max_bytes: int = 0  # 0: ``window_bytes``
    # Size each job's slices and window by its pace (dispatcher/pacing.py), as the
    # service does; off, they are RELAY_SLICE_ROWS and the row window whatever the pace.
    paced: bool = False
    # Order each release by the rows' request text (relay_batches.prefixes): rows
    # sharing a prefix go out together, so the provider's prompt cache sees them so.
    group_prefixes: bool = False

    @property
    def windows(self) -> Windows:
        """A workspace's window bounds."""
        return Windows(
            self.window,
            self.window_bytes,
            max(self.window, self.window_max),
            max(self.window_bytes, self.window_max_bytes),
        )


@dataclass
class OwnedJob:
    """A job this dispatcher releases rows for."""

    job: RunningJob
    dispatched_upto: int
    done: int
    lock: asyncio.Lock
    sent: SendLog
    held: bool = False
    level: int = 0
    boost: int = 0
    announced_level: int = 0  # the highest level a ``job.overtaking`` announced
    settled_below: int = 0  # every row below has an outcome (where in-flight bytes start)
    # At least the bytes of its rows in flight (a ledger reading plus the rows released
    # since); None until read.
    flying: int | None = None

    @property
    def exhausted(self) -> bool:
        """Every row has been released, or its budget stopped it (nothing more goes)."""
        return self.dispatched_upto >= self.job.total or self.job.budget_stopped

    @property
    def in_flight(self) -> int:
        """Rows published that have no outcome yet (as far as this dispatcher knows)."""
        return max(0, self.dispatched_upto - self.done)


class DispatcherState:
    """What a dispatcher holds, shared by its parts (claiming, release, recovery):
    built once by :class:`~relay_batches.services.dispatcher.core.Dispatcher`."""

    def __init__(
        self,
        store: Store,
        publish_slice: PublishSlice,
        announce_failed: AnnounceFailed,
        model_known: Callable[[str], bool],
        config: DispatchConfig,
        rows_waiting: Callable[[], Awaitable[int]] | None = None,
        *,
        inflight: InFlight | None = None,
        clock: Callable[[], float] = time.monotonic,
        results_state: QueueState | None = None,
        plan_lanes: PlanLanes | None = None,
        price_of: PriceOf = lambda alias: None,
        connected: Callable[[], bool] = lambda: True,
        announce_overtaking: Callable[[JobEvent], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        self._announce_overtaking = announce_overtaking
        self._price_of = price_of
        # Whether our broker connection is up (consumers restored), and whether it
        # dropped since stall recovery last judged (see Recovery.sight_lost).
        self._connected = connected
        self._sight_lost = False
        self._plan_lanes = plan_lanes
        self._publish_slice = publish_slice
        self._announce_failed = announce_failed
        self._model_known = model_known
        self._config = config
        self._rows_waiting = rows_waiting
        self.inflight = inflight if inflight is not None else InFlight(config.owner)
        self.paces = Paces()  # each job's time per row, learned from its outcomes
        self._clock = clock
        self._results_state = results_state
        # The results queues behind at the last pass (of ``_behind_count`` shards).
        self._behind: frozenset[int] = frozenset()
        self._behind_count = 0
        self._started_at = clock()
        self._claiming = asyncio.Lock()
        self._stopped = False
        self.jobs: dict[str, OwnedJob] = {}

    @property
    def owner(self) -> str:
        """Our owner id: the jobs' ``lease_owner``, and the word our progress events are
        routed by."""
        return self._config.owner

    def stop_claiming(self) -> None:
        """From now on claim nothing new (the service is stopping; its leases go back)."""
        self._stopped = True
