"""Creating jobs: the one place a submission becomes a :class:`NewJob`, ledger rows and a
wake-up, whichever surface it came from.

A surface translates its request into job-level fields and request rows; here the fields
are validated (:func:`job_fields`, the rules of ``POST /v1/batches`` for every surface),
the job is built (:func:`plan_job`), stored with its ``Idempotency-Key`` claim in one
transaction (:func:`store_one`) and a dispatcher is woken (:func:`announce_created`). The
order of those steps, the same for every surface, is :func:`.create.create`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from relay_batches.cron import next_tick
from relay_batches.ids import new_id
from relay_batches.ledger.idempotency import IdempotencyClaim
from relay_batches.ledger.jobs import NewJob
from relay_batches.metrics import JOB_TRANSITIONS
from relay_batches.model import Job, JobStatus
from relay_batches.services.ingest_api.deps import ApiDeps
from relay_batches.services.ingest_api.rows.job_fields import (
    BatchOptions,
    validate_batch_options,
)
from relay_batches.services.ingest_api.rows.validation import (
    KnownModels,
    RowInput,
    scan_submit,
)

log = logging.getLogger("relay.ingest_api")


@dataclass(frozen=True)
class PlannedJob:
    """A validated job, ready to insert."""

    new: NewJob
    rows: list[RowInput]


def job_fields(fields: Mapping[str, object], deps: ApiDeps) -> BatchOptions:
    """Validate a submission's job-level fields against the router's aliases."""
    return validate_batch_options(fields, KnownModels(deps.model_known))


def row_models(deps: ApiDeps) -> KnownModels:
    """The router's aliases, which a row's own ``model`` may name."""
    return KnownModels(deps.model_known)


def plan_submission(
    raw: bytes | bytearray, deps: ApiDeps, workspace_id: str, now: datetime
) -> PlannedJob:
    """The job of a ``POST /v1/batches`` body, decoded row by row (:func:`scan_submit`).

    CPU-bound and free of the event loop: callers run it in a worker thread.
    """
    spec = scan_submit(raw, deps.limits, KnownModels(deps.model_known))
    return plan_job(spec.options, spec.rows, workspace_id, now)


def plan_job(
    options: BatchOptions,
    rows: list[RowInput],
    workspace_id: str,
    now: datetime,
    name: str | None = None,
) -> PlannedJob:
    """Build the job: ``name`` (default ``options.name``, else ``batch <timestamp>``).

    A job with a completion window expires that long after the ledger stores it (the
    database's clock, the one the reaper and the claims compare with: see
    :func:`relay_batches.ledger.jobs.NewJob`); a cron template keeps the window for each
    run it spawns (see :mod:`relay_batches.ledger.schedule`).
    """
    chosen = options.name if name is None else name
    window = options.completion_window
    new = NewJob(
        id=new_id(),
        workspace_id=workspace_id,
        name=chosen or f"batch {now.strftime('%Y-%m-%dT%H:%M:%SZ')}",
        model=options.model,
        priority=options.priority,
        total=len(rows),
        webhook_url=options.webhook_url,
        cron=options.cron,
        next_run_at=next_tick(options.cron, now) if options.cron else None,
        params=options.params_json,
        metadata=options.metadata_json,
        completion_window=window,
        budget_usd=options.budget_usd,
        endpoint=options.endpoint,
    )
    return PlannedJob(new, rows)


def plan_stored_job(
    options: BatchOptions,
    rows_batch_id: str,
    total: int,
    workspace_id: str,
    now: datetime,
) -> PlannedJob:
    """A job over ``total`` rows already stored under ``rows_batch_id`` (an uploaded
    file's), which are not copied."""
    planned = plan_job(options, [], workspace_id, now)
    return PlannedJob(replace(planned.new, total=total, rows_batch_id=rows_batch_id), [])


async def store_one(
    deps: ApiDeps, planned: PlannedJob, claim: IdempotencyClaim | None, large: bool = False
) -> Job:
    """Store one job with its rows (recording its 201 for ``claim``); announcing it is
    the create sequence's last step (:func:`announce_created`).

    :class:`KeyTaken` if a concurrent request with the same key stored first.
    """
    return await deps.jobs.create(planned.new, _row_pairs(planned), claim)


async def announce_created(deps: ApiDeps, job: Job) -> None:
    """Count, log and announce a job just stored: wake a dispatcher (or the schedulers
    for a cron template)."""
    await _created(deps, [job])


def _row_pairs(planned: PlannedJob) -> Iterator[tuple[str, str]]:
    return ((r.custom_id, r.request_json) for r in planned.rows)


async def _created(deps: ApiDeps, created: list[Job]) -> None:
    for job in created:
        JOB_TRANSITIONS.labels(job.status).inc()
        log.info("batch_created", extra={"batch_id": job.id, "total": job.total})
        await wake(deps, job)


async def wake(deps: ApiDeps, job: Job) -> None:
    """Wake a dispatcher for a new queued job, or schedulers for a new cron template.

    The job is committed: a lost wake-up only delays it (dispatchers reconcile from the
    ledger, schedulers look again within their sleep cap).
    """
    try:
        if job.status == JobStatus.QUEUED:
            await deps.announcer.wake_dispatcher(job)
        elif job.status == JobStatus.SCHEDULED:
            await deps.announcer.template_created(job)
    except Exception as exc:
        log.warning("wakeup_failed", extra={"batch_id": job.id, "error": repr(exc)})
