"""What the offloader publishes: the answers of an ended provider batch as outcomes
(chunks per results shard, each confirmed before its rows are marked done) and the rows
to go realtime as ordinary slices (see the passes 3 and 4 in
:mod:`~relay_batches.services.offloader.core`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

import orjson

from relay_batches.bus.topology import results_shard
from relay_batches.ledger.offload import (
    ForwardRow,
    OffloadBatch,
    OffloadStore,
    RowState,
)
from relay_batches.messages import UNPAUSED, OutcomesMessage, RowOutcome, SliceMessage, SliceRow
from relay_batches.metrics import OFFLOAD_ROWS
from relay_batches.offload.lines import ResultLine
from relay_batches.outcome import to_outcome
from relay_batches.router.aliases import Price
from relay_batches.router.types import RowResult

if TYPE_CHECKING:
    from relay_batches.services.offloader.core import OffloadConfig

log = logging.getLogger("relay.offloader")

GATHER_ROUNDS = 16  # bounded steps a pass (intake, gathering, forwarding) takes at most
FORWARD_ROWS = 500
FORWARD_SLICE_ROWS = 50
FORWARD_BYTES = 8 * 1024 * 1024  # of row requests taken at once (a row larger goes alone)
MAX_SLICE_BYTES = 4 * 1024 * 1024  # a forwarded slice's requests, as the dispatcher's
OUTCOME_ROWS = 200
OUTCOME_BYTES = 256 * 1024


PublishOutcomes = Callable[[int, bytes], Awaitable[None]]  # (results shard, message body)
PublishSlice = Callable[[SliceMessage], Awaitable[None]]


class Publishing:
    """The offloader's publishing steps, on what
    :class:`~relay_batches.services.offloader.core.Offloader` holds."""

    _store: OffloadStore
    _config: OffloadConfig
    _prices: Mapping[str, Price]
    _references: Mapping[str, Price]
    _publish_outcomes: PublishOutcomes
    _publish_slice: PublishSlice

    async def _publish_results(self, lines: AsyncIterator[ResultLine], batch: OffloadBatch) -> int:
        """Publish every answered line as an outcome (chunks per results shard, each
        confirmed, then its rows marked done); mark the unanswered ones forward."""
        chunks = _Chunks(self._config.shards)
        price = self._prices.get(batch.deployment)
        reference = self._references.get(batch.deployment)
        refused: list[tuple[str, int]] = []
        answered = 0
        async for line in lines:
            if line.reply is None or line.reply.completion is None:
                refused.append((line.batch_id, line.row_index))
                if len(refused) >= OUTCOME_ROWS:
                    await self._store.mark_rows(refused, RowState.FORWARD)
                    refused = []
                continue
            result = RowResult(line.reply.completion, None, 1, batch.deployment, lane="batch")
            full = chunks.add(
                to_outcome(line.batch_id, line.row_index, result, None, price, reference)
            )
            if full is not None:
                answered += await self._flush(chunks, full)
        await self._store.mark_rows(refused, RowState.FORWARD)
        for shard in chunks.shards():
            answered += await self._flush(chunks, shard)
        return answered

    async def _flush(self, chunks: _Chunks, shard: int) -> int:
        outcomes, parts = chunks.take(shard)
        if not outcomes:
            return 0
        # A row moved to another lane meanwhile (the ramp, a stall) is that lane's: its
        # answer here is discarded, never recorded nor charged (a row is paid once).
        waiting, moved = await self._store.still_submitted(
            [(o.batch_id, o.row_index) for o in outcomes]
        )
        if moved or len(waiting) < len(outcomes):
            OFFLOAD_ROWS.labels("superseded").inc(moved)
            kept = [i for i, o in enumerate(outcomes) if (o.batch_id, o.row_index) in waiting]
            outcomes = [outcomes[i] for i in kept]
            parts = [parts[i] for i in kept]
            if not outcomes:
                return 0
        await self._publish_outcomes(shard, OutcomesMessage.encode_parts(parts))
        _, late = await self._store.mark_done([(o.batch_id, o.row_index) for o in outcomes])
        OFFLOAD_ROWS.labels("late").inc(late)
        return len(outcomes)

    # --- 4. forward --------------------------------------------------------------------

    async def forward_pass(self) -> None:
        """Publish the rows waiting to go realtime, a bounded batch per transaction."""
        for _ in range(GATHER_ROUNDS):
            moved = await self._store.forward(FORWARD_ROWS, FORWARD_BYTES, self._forward)
            OFFLOAD_ROWS.labels("forwarded").inc(moved)
            if moved < FORWARD_ROWS:
                return

    async def _forward(self, rows: list[ForwardRow]) -> None:
        """Slices of consecutive rows of one job, confirmed together."""
        slices: list[SliceMessage] = []
        run: list[ForwardRow] = []
        size = 0
        for row in rows:
            if run and (
                row.batch_id != run[0].batch_id
                or row.row_index != run[-1].row_index + 1
                or len(run) >= FORWARD_SLICE_ROWS
                or size + len(row.request) > MAX_SLICE_BYTES
            ):
                slices.append(_slice(run, self._config.owner))
                run, size = [], 0
            run.append(row)
            size += len(row.request)
        if run:
            slices.append(_slice(run, self._config.owner))
        await asyncio.gather(*(self._publish_slice(s) for s in slices))
        log.info("offload_forwarded", extra={"rows": len(rows), "slices": len(slices)})


def _slice(run: list[ForwardRow], owner: str) -> SliceMessage:
    """A slice of ``run`` at the broker's base level, as the dispatcher publishes a job's
    rows (only its short-lived boost over a workspace's lower jobs goes higher): a job's
    priority orders it within its workspace, and a level from it would put these rows
    ahead of every other workspace's, against the fair share. Its rows are never handed
    back on a pause (:data:`UNPAUSED`): no dispatcher releases an offloaded job's rows."""
    first = run[0]
    return SliceMessage(
        first.batch_id,
        first.model,
        tuple(SliceRow(r.row_index, r.request) for r in run),
        first.params,
        0,
        0.0,
        owner,
        first.expires_at.timestamp() if first.expires_at else 0.0,
        pauses=UNPAUSED,
    )


class _Chunks:
    """Outcomes waiting to be published, per results shard, each shard's chunk bounded
    in rows and encoded bytes."""

    def __init__(self, shards: int) -> None:
        self._shards = max(1, shards)
        self._pending: dict[int, tuple[list[RowOutcome], list[bytes], int]] = {}

    def add(self, outcome: RowOutcome) -> int | None:
        """Queue ``outcome``; the shard whose chunk is now full, if any."""
        shard = results_shard(outcome.batch_id, self._shards)
        outcomes, parts, size = self._pending.setdefault(shard, ([], [], 0))
        encoded = orjson.dumps(outcome.as_list())
        outcomes.append(outcome)
        parts.append(encoded)
        size += len(encoded) + 1
        self._pending[shard] = (outcomes, parts, size)
        full = len(outcomes) >= OUTCOME_ROWS or size >= OUTCOME_BYTES
        return shard if full else None

    def take(self, shard: int) -> tuple[list[RowOutcome], list[bytes]]:
        """The shard's chunk, removed."""
        outcomes, parts, _ = self._pending.pop(shard, ([], [], 0))
        return outcomes, parts

    def shards(self) -> list[int]:
        """The shards with outcomes waiting."""
        return sorted(self._pending)
