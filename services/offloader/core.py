"""The offloader's passes: take offloaded rows in, gather them into provider batches,
create those, poll them, read their results back, forward what they did not answer.

1. **intake** — the released rows of offloaded jobs become offload rows (under the batch
   deployment leading each row's alias, or ``forward``); rows of jobs that ended are
   dropped; each batch deployment's pending rows are cut into provider batches when
   due (rows, bytes, linger), each recorded with its rows in the ledger before anything
   is sent.
2. **submit** — a recorded batch's input is built on disk and sent (OpenAI: uploaded,
   then the batch created; Anthropic: created with the requests). A create is counted
   in the ledger before it is tried; a record resumed with such a count first looks for
   the provider batch it may already have made, so no row is ever submitted twice.
3. **poll** — a submitted batch is polled every ``poll_s``, doubling while it makes no
   progress up to ``10 × poll_s``; one whose rows all belong to jobs that ended is
   canceled at the provider. An ended batch's results are streamed back: answers are
   published to the results queue as outcomes (the batch deployment's name and price,
   one attempt), in confirmed messages bounded in rows and bytes, and only then marked
   done; every other row (failed, expired, missing, or all of a batch that failed
   whole) is forwarded. A crash while publishing re-reads the results and publishes
   again: the aggregator's insert is idempotent.
4. **forward** — rows to go realtime are published as ordinary slices on the rows queue
   (their job's alias, params and deadline; the router skips the batch deployment) and
   marked forwarded in the same transaction as they were taken.

No aio-pika here: the store, the provider clients and the publishers are passed in.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import asyncpg

from relay_batches.errors import PermanentError, TransientError
from relay_batches.lanes.plan import stall_after_s
from relay_batches.ledger.offload import (
    BatchState,
    Gathering,
    OffloadBatch,
    OffloadStore,
)
from relay_batches.metrics import OFFLOAD_BATCHES, OFFLOAD_POLLS, OFFLOAD_ROWS
from relay_batches.offload.lines import BatchClient, ProviderError, ProviderState
from relay_batches.router.aliases import AliasTable, Price
from relay_batches.services.offloader.inputs import build_input
from relay_batches.services.offloader.lanes import LaneWatch
from relay_batches.services.offloader.publishing import (
    GATHER_ROUNDS,
    Publishing,
    PublishOutcomes,
    PublishSlice,
)

log = logging.getLogger("relay.offloader")

Step = Callable[[OffloadBatch, BatchClient], Coroutine[Any, Any, None]]  # one record's step

CLAIM_LIMIT = 4
# What one record's step may fail with besides a provider's refusal, none of which may
# stop the pass for the others: the network while streaming, the disk while building the
# input (ENOSPC), the ledger (away, or refusing one statement).
STEP_FAILURES: tuple[type[BaseException], ...] = (
    aiohttp.ClientError,
    TimeoutError,
    OSError,
    asyncpg.PostgresError,
    TransientError,
    PermanentError,
)
MAX_POLL_FACTOR = 10
RETRY_S = 5.0
# A batch the provider holds whose polls it keeps refusing (401/403/400) ends after so
# many refusals in a row, or once its window and this slack have passed.
MAX_REFUSALS = 10
MAX_TRACKED = 10_000  # records whose refusals one offloader counts at once
WINDOW_SLACK_S = 3600.0
# Of a deployment's max_bytes, what its gathered rows' sizes (each with a fixed envelope)
# may fill: the rest is room for what a provider's request format adds to a row (an
# Anthropic translation's content blocks), so an input never crosses the provider's cap.
BYTES_SHARE = 0.9


@dataclass(frozen=True)
class OffloadConfig:
    """Tuning of one offloader."""

    owner: str
    lease_s: float = 60.0
    shards: int = 1
    spool_dir: str | None = None
    margin_s: float = 3600.0  # RELAY_OFFLOAD_MARGIN: gather's deadline check, as the dispatcher's
    group_prefixes: bool = False  # RELAY_PREFIX_GROUPING: each input page by request text


class Offloader(Publishing):
    """The passes over the ledger, one provider client per batch deployment."""

    def __init__(
        self,
        store: OffloadStore,
        aliases: AliasTable,
        clients: Mapping[str, BatchClient],
        publish_outcomes: PublishOutcomes,
        publish_slice: PublishSlice,
        config: OffloadConfig,
    ) -> None:
        self._store = store
        self._clients = clients
        self._publish_outcomes = publish_outcomes
        self._publish_slice = publish_slice
        self._config = config
        self._prices: Mapping[str, Price] = aliases.prices()
        self._references: Mapping[str, Price] = aliases.realtime_references()
        self._lanes = LaneWatch(store, aliases)
        # Consecutive permanent refusals of a record's steps here (reset by a step that
        # passes or that ends it), at most MAX_TRACKED records.
        self._refusals: dict[int, int] = {}
        # Every alias with its lead ("" for none: its rows go realtime), so a row naming an
        # alias never takes the lead of another alias's pattern.
        self._leads = {
            alias: getattr(aliases.batch_lead(alias), "name", "") for alias in aliases.names()
        }
        self._patterns = aliases.lead_patterns()
        self._routed = frozenset(aliases.batch_deployments())
        self._gatherings = [
            Gathering(
                d.name,
                d.batch.max_rows,
                int(d.batch.max_bytes * BYTES_SHARE),
                d.batch.linger_s,
                window_s=stall_after_s(d.batch.turnaround.total_seconds()),
                margin_s=config.margin_s,
            )
            for d in aliases.batch_deployments().values()
            if d.batch is not None
        ]

    # --- 1. intake ---------------------------------------------------------------------

    async def intake_pass(self) -> None:
        """Take released rows in, drop those of ended jobs, gather what is due."""
        taken = 0
        for _ in range(GATHER_ROUNDS):  # a large job's rows: several bounded steps a pass
            step = await self._store.intake(
                self._leads, routed=self._routed, patterns=self._patterns
            )
            taken += step
            if not step:
                break
        dropped = await self._store.drop_ended()
        OFFLOAD_ROWS.labels("dropped").inc(dropped)
        for gathering in self._gatherings:
            for _ in range(GATHER_ROUNDS):
                made = await self._store.gather(gathering)
                if made is None:
                    break
                OFFLOAD_BATCHES.labels(gathering.deployment, BatchState.RECORDED).inc()
                log.info(
                    "offload_recorded",
                    extra={"offload_id": made, "deployment": gathering.deployment},
                )
        if taken or dropped:
            log.info("offload_intake", extra={"rows": taken, "dropped": dropped})

    # --- 2. submit ---------------------------------------------------------------------

    async def submit_pass(self) -> None:
        """Send the recorded provider batches (those left by a crash included)."""
        await self._each_claimed([BatchState.RECORDED, BatchState.CREATING], self._submit)

    async def _submit(self, batch: OffloadBatch, client: BatchClient) -> None:
        owner = self._config.owner
        if batch.polls > 0 and await self._adopt_made(batch, client):
            return
        built = await build_input(
            self._store, client, batch.id, self._config.spool_dir, self._config.group_prefixes
        )
        try:
            if built.rows == 0:
                await self._store.set_ended(batch.id, owner, None, None, "no row could be sent")
                return
            await self._store.resize(batch.id, owner, built.rows, built.size)
            file_id = batch.input_file_id or await client.upload(batch.id, built.path)
            if not await self._store.set_creating(batch.id, owner, file_id):
                return  # no longer ours: its new owner sends it
            if not await self._store.attempt(batch.id, owner):
                return
            provider_id = await client.create(batch.id, built.path, file_id)
        finally:
            await asyncio.to_thread(os.unlink, built.path)
        if await self._store.set_submitted(batch.id, owner, provider_id):
            OFFLOAD_BATCHES.labels(batch.deployment, BatchState.SUBMITTED).inc()
            OFFLOAD_ROWS.labels("submitted").inc(built.rows)
            log.info(
                "offload_submitted",
                extra={"offload_id": batch.id, "provider_id": provider_id, "rows": built.rows},
            )

    async def _adopt_made(self, batch: OffloadBatch, client: BatchClient) -> bool:
        """A create was tried before (a crash after it?): take the provider batch made for
        this record if there is one that no other record holds."""
        since = batch.created_at.timestamp()
        for provider_id in await client.find(batch.id, batch.rows, since):
            if await self._store.others_hold(provider_id, batch.id):
                continue
            if await self._store.set_submitted(batch.id, self._config.owner, provider_id):
                log.warning(
                    "offload_resumed", extra={"offload_id": batch.id, "provider_id": provider_id}
                )
                OFFLOAD_BATCHES.labels(batch.deployment, BatchState.SUBMITTED).inc()
            return True
        return False

    # --- 3. poll and settle ------------------------------------------------------------

    async def poll_pass(self) -> None:
        """Poll the submitted batches that are due; settle those that ended."""
        states = [BatchState.SUBMITTED, BatchState.CANCELING, BatchState.ENDED]
        await self._each_claimed(states, self._poll)

    async def _poll(self, batch: OffloadBatch, client: BatchClient) -> None:
        owner = self._config.owner
        if batch.state is BatchState.ENDED:
            await self._settle(batch, client)
            return
        assert batch.provider_id is not None
        OFFLOAD_POLLS.labels(batch.deployment).inc()
        state = await client.status(batch.provider_id)
        if not state.ended:
            if batch.state is BatchState.SUBMITTED and await self._store.all_rows_ended(batch.id):
                if not await self._cancel(batch, client):
                    return
            elif batch.state is BatchState.SUBMITTED and await self._move_lanes(batch):
                if not await self._cancel(batch, client):
                    return
            poll_s = self._poll_s(batch.deployment)
            await self._store.polled(
                batch.id, owner, state.progress, poll_s, poll_s * MAX_POLL_FACTOR
            )
            return
        if await self._store.set_ended(batch.id, owner, state.output, state.errors, state.failed):
            OFFLOAD_BATCHES.labels(batch.deployment, BatchState.ENDED).inc()
            log.info(
                "offload_ended",
                extra={"offload_id": batch.id, "failed": state.failed, "progress": state.progress},
            )
            await self._settle(_ended(batch, state), client)

    async def _move_lanes(self, batch: OffloadBatch) -> bool:
        """Move a stalled batch's rows, or those the ramp wants, to the fast lanes;
        whether they moved, now or at an earlier poll (the batch is then canceled: a
        cancel that failed before is tried again)."""
        reason = await self._lanes.verdict(batch)
        if reason is None:
            return False
        moved = await self._store.move(batch.id, self._config.owner, reason)
        if moved:
            OFFLOAD_ROWS.labels("moved").inc(moved)
            log.warning(
                "offload_moved",
                extra={"offload_id": batch.id, "reason": reason, "rows": moved},
            )
        return True

    async def _cancel(self, batch: OffloadBatch, client: BatchClient) -> bool:
        """Ask the provider to cancel a running batch whose rows all belong to jobs that
        ended; False when the record is no longer ours. A refused cancel (the batch
        ended or is ending meanwhile: OpenAI and Anthropic answer 400 or 409) is no
        failure: polling goes on and reads the end."""
        assert batch.provider_id is not None
        try:
            await client.cancel(batch.provider_id)
        except ProviderError as exc:
            if not (exc.permanent or "HTTP 409" in str(exc)):
                raise
            log.info("offload_cancel_refused", extra={"offload_id": batch.id, "error": str(exc)})
            return True
        if not await self._store.set_canceling(batch.id, self._config.owner):
            return False
        log.info("offload_canceling", extra={"offload_id": batch.id})
        return True

    async def _settle(self, batch: OffloadBatch, client: BatchClient) -> None:
        """Publish the answers, forward the rest, settle the record."""
        answered = 0
        if batch.error is None:
            state = ProviderState(True, 0, batch.output_file_id, batch.error_file_id)
            answered = await self._publish_results(client.results(state, batch.id), batch)
        forwarded = await self._store.settle(batch.id, self._config.owner)
        OFFLOAD_ROWS.labels("answered").inc(answered)
        OFFLOAD_BATCHES.labels(batch.deployment, BatchState.SETTLED).inc()
        log.info(
            "offload_settled",
            extra={
                "offload_id": batch.id,
                "answered": answered,
                "forwarded": forwarded,
                "error": batch.error,
            },
        )

    # --- helpers -----------------------------------------------------------------------

    async def _each_claimed(
        self,
        states: list[BatchState],
        step: Step,
    ) -> None:
        """Run ``step`` on up to :data:`CLAIM_LIMIT` due records in ``states``, claiming
        each only when the one before is done: a record waiting behind a long upload is
        not leased meanwhile (its lease would lapse and another replica take it while we
        still meant to work on it)."""
        for _ in range(CLAIM_LIMIT):
            claimed = await self._store.claim(self._config.owner, states, self._config.lease_s, 1)
            if not claimed:
                return
            await self._step(claimed[0], step)

    async def _step(self, batch: OffloadBatch, step: Step) -> None:
        """Run one record's step; a failure (the provider's, the network's, the disk's or
        the ledger's) lets the record go until later, but a provider's refusal that
        cannot pass (see :func:`gives_up`) ends it: its rows go realtime."""
        client = self._clients.get(batch.deployment)
        owner = self._config.owner
        if client is None:
            # The deployment left the routes file: its rows go realtime.
            await self._store.set_ended(batch.id, owner, None, None, "deployment not routed")
            await self._store.settle(batch.id, owner)
            return
        started = time.perf_counter()
        work = asyncio.create_task(step(batch, client), name=f"offload-{batch.id}")
        renewal = asyncio.create_task(self._keep_lease(batch.id, work), name=f"lease-{batch.id}")
        try:
            await work
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are stopping, not the step
            log.warning("offload_step_lost", extra={"offload_id": batch.id})
        except ProviderError as exc:
            if len(self._refusals) >= MAX_TRACKED and batch.id not in self._refusals:
                self._refusals.clear()  # records other replicas took: their counts lapse
            refusals = self._refusals.get(batch.id, 0) + (1 if exc.permanent else 0)
            self._refusals[batch.id] = refusals
            end = gives_up(batch.state, exc, refusals, _past_window(batch, client))
            if end:
                self._refusals.pop(batch.id, None)
            await self._failed(batch, str(exc), exc.permanent, end)
        except STEP_FAILURES as exc:
            # A failure of ours (the ledger, the disk) ends the record only once the
            # provider's window is over: its rows then go realtime instead of waiting on.
            end = _past_window(batch, client)
            await self._failed(batch, f"{exc.__class__.__name__}: {exc}", False, end)
        else:
            self._refusals.pop(batch.id, None)
        finally:
            renewal.cancel()
            await asyncio.gather(renewal, return_exceptions=True)
        log.debug(
            "offload_step",
            extra={"offload_id": batch.id, "elapsed_s": round(time.perf_counter() - started, 3)},
        )

    async def _failed(self, batch: OffloadBatch, error: str, permanent: bool, end: bool) -> None:
        """A step failed: end the record (its rows go realtime) or let it go until
        :data:`RETRY_S` from now; a ledger away meanwhile leaves it to its lease."""
        owner = self._config.owner
        log.warning(
            "offload_step_failed",
            extra={"offload_id": batch.id, "error": error, "permanent": permanent},
        )
        try:
            if end:
                await self._store.set_ended(batch.id, owner, None, None, error[:500])
                await self._store.settle(batch.id, owner)
            else:
                await self._store.retry_later(batch.id, owner, RETRY_S, error)
        except STEP_FAILURES as exc:
            log.warning(
                "offload_step_failure_not_recorded",
                extra={"offload_id": batch.id, "error": repr(exc)},
            )

    async def _keep_lease(self, offload_id: int, work: asyncio.Task[None]) -> None:
        """Renew the record's lease every third of it while its step ``work`` runs, so a
        long upload or download is never taken over (and its rows submitted twice)
        midway; a record found no longer ours stops its step at once. (A step lets its
        lease go only in its last ledger call, with nothing to await after it.)"""
        lease_s = self._config.lease_s
        while True:
            await asyncio.sleep(lease_s / 3)
            try:
                if not await self._store.renew(offload_id, self._config.owner, lease_s):
                    work.cancel()
                    return
            except Exception as exc:  # the ledger away: the step fails on its own
                log.warning("offload_lease_renewal_failed", extra={"error": repr(exc)})

    def _poll_s(self, deployment: str) -> float:
        client = self._clients[deployment]
        options = client.deployment.batch
        return 30.0 if options is None else options.poll_s


def gives_up(
    state: BatchState, exc: ProviderError, refusals: int = 1, past_window: bool = False
) -> bool:
    """Whether a failed step ends its record (every row it did not answer goes
    realtime) rather than waiting for the next try: a permanent refusal before the
    provider holds the batch (the input or the create refused), one of a batch the
    provider does not know (404), or of its results once it ended. A batch the provider
    holds is otherwise polled again (it may still answer) until :data:`MAX_REFUSALS`
    consecutive permanent refusals (a key revoked: 401/403) or one past its window
    (``past_window``: the provider's promise is over)."""
    if past_window:
        return True  # whatever the failure: transient ones (5xx, timeouts) too
    if not exc.permanent:
        return False
    if state in (BatchState.RECORDED, BatchState.CREATING, BatchState.ENDED):
        return True
    return "HTTP 404" in str(exc) or refusals >= MAX_REFUSALS


def _past_window(batch: OffloadBatch, client: BatchClient) -> bool:
    """Whether the provider's window for the batch (counted from its record, made just
    before its create) and :data:`WINDOW_SLACK_S` have passed."""
    options = client.deployment.batch
    window_s = 24 * 3600.0 if options is None else options.window.total_seconds()
    return time.time() > batch.created_at.timestamp() + window_s + WINDOW_SLACK_S


def _ended(batch: OffloadBatch, state: ProviderState) -> OffloadBatch:
    """``batch`` as its ended record reads."""
    return replace(
        batch,
        state=BatchState.ENDED,
        output_file_id=state.output,
        error_file_id=state.errors,
        error=state.failed,
    )
