"""The ingest-api's bus side-effects: wake a dispatcher, announce a cancel, a pause or a
template."""

from __future__ import annotations

from relay_batches.announce import announce_finished, wake_dispatcher
from relay_batches.bus.client import Bus
from relay_batches.bus.topology import (
    EVENT_CANCELED,
    EVENT_PAUSED,
    EVENT_PROGRESS,
    EVENT_TEMPLATE_CREATED,
)
from relay_batches.ledger.jobs import JobStore
from relay_batches.messages import JobEvent, TemplateCreated
from relay_batches.model import Job, iso
from relay_batches.services.ingest_api.deps import Announcer


def publisher_for(bus: Bus, jobs: JobStore) -> Announcer:
    """The API's bus side-effects, each publish awaiting its confirm."""

    async def wake(job: Job) -> None:
        await wake_dispatcher(bus, job.id, job.priority, trace=job.traceparent)

    async def job_canceled(job: Job) -> None:
        event = JobEvent(job.id, job.status, job.total, job.completed, job.failed)
        await bus.publish_event(EVENT_CANCELED, event.encode())
        await announce_finished(bus.publish_event, jobs.mark_finished_published, [event])

    async def template_created(job: Job) -> None:
        created = TemplateCreated(job.id, iso(job.next_run_at) or "")
        await bus.publish_event(EVENT_TEMPLATE_CREATED, created.encode())

    async def job_paused(job: Job) -> None:
        # A progress event whose status is paused: the dispatcher that owns the job
        # stops releasing its rows at once (it forgets any job that is not running).
        # And ``job.paused`` with its pause count: row-workers hand back the rows of it
        # they hold and have not started.
        event = JobEvent(job.id, job.status, job.total, job.completed, job.failed, job.pauses)
        await bus.publish_event(EVENT_PROGRESS, event.encode())
        await bus.publish_event(EVENT_PAUSED, event.encode())

    return Announcer(wake, job_canceled, template_created, job_paused)
