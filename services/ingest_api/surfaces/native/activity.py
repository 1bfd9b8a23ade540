"""What happened, read back: ``GET /v1/batches/{id}/timeline`` (a job's dated events) and
``GET /v1/usage`` (the workspace's rows, tokens and cost per day and model), both summed
up in the ledger in one bounded statement each; and what is happening now,
``GET /v1/workers`` (the live row-workers, queue depths and throttled deployments, from
:mod:`..fleet`) (docs/api/native.md)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from aiohttp import web

from relay_batches.errors import ApiError, invalid
from relay_batches.ledger.pool import translated
from relay_batches.ledger.timeline import TimelineStore
from relay_batches.ledger.usage import MAX_DAYS, UsageStore
from relay_batches.services.ingest_api.deps import DEPS
from relay_batches.services.ingest_api.edge.middleware import WORKSPACE_ID, json_response
from relay_batches.services.ingest_api.surfaces.native.batches import _find

DEFAULT_DAYS = 30  # the usage range without from/to: the last 30 days, today included


def add_activity_routes(app: web.Application) -> None:
    """Register the timeline, usage and workers routes on ``app``."""
    app.router.add_get("/batches/{id}/timeline", get_timeline)
    app.router.add_get("/usage", get_usage)
    app.router.add_get("/workers", get_workers)


# The workspace's jobs among ``$2`` (the ids a heartbeat names): one indexed lookup.
_OWN_JOBS = "SELECT id, name FROM batches WHERE workspace_id = $1 AND id = ANY($2::text[])"


async def get_workers(request: web.Request) -> web.Response:
    """``GET /v1/workers``: the live row-workers (the rows each holds: this workspace's by
    job, the others' as a count), the queue depths and the deployments throttled lately."""
    deps = request.app[DEPS]
    if deps.fleet is None:
        raise ApiError(503, "this API is not listening to the row-workers")
    live = deps.fleet.watch.live()
    ids = sorted({held.batch_id for seen in live for held in seen.report.held})
    async with translated():
        found = await deps.pool.fetch(_OWN_JOBS, request[WORKSPACE_ID], ids) if ids else []
    own: dict[str, str] = {r["id"]: r["name"] for r in found}
    now = deps.fleet.watch.clock()
    workers: list[dict[str, object]] = []
    for seen in live:
        jobs = [
            {"id": held.batch_id, "name": own[held.batch_id], "rows": len(held.rows)}
            for held in seen.report.held
            if held.batch_id in own
        ]
        total = sum(len(held.rows) for held in seen.report.held)
        mine = sum(len(held.rows) for held in seen.report.held if held.batch_id in own)
        workers.append(
            {
                "worker": seen.report.worker,
                "concurrency": seen.report.concurrency,
                "rows_held": total,
                "jobs": jobs,
                "other_rows": total - mine,
                "seconds_ago": round(now - seen.at, 1),
            }
        )
    return json_response(
        {
            "object": "workers",
            "workers": workers,
            "queues": await deps.fleet.depths(),
            "throttled": deps.fleet.watch.throttles(),
        }
    )


async def get_timeline(request: web.Request) -> web.Response:
    """``GET /v1/batches/{id}/timeline``: the job's events, oldest first."""
    job = await _find(request)
    events, more = await TimelineStore(request.app[DEPS].pool).timeline(job)
    return json_response(
        {
            "object": "list",
            "batch_id": job.id,
            "data": [e.to_api() for e in events],
            "has_more": more,
        }
    )


async def get_usage(request: web.Request) -> web.Response:
    """``GET /v1/usage?from=&to=``: sums per UTC day and model of the workspace's jobs
    created in the range (whole days, at most ``MAX_DAYS``)."""
    first, last = usage_range(request.query.get("from"), request.query.get("to"), _today())
    lines = await UsageStore(request.app[DEPS].pool).usage(request[WORKSPACE_ID], first, last)
    return json_response(
        {
            "object": "usage",
            "from": first.isoformat(),
            "to": last.isoformat(),
            "data": [line.to_api() for line in lines],
        }
    )


def _today() -> date:
    return datetime.now(UTC).date()


def usage_range(raw_from: str | None, raw_to: str | None, today: date) -> tuple[date, date]:
    """The days asked for: ``to`` defaults to today, ``from`` to 29 days before ``to``;
    a 400 naming the parameter for a date that is not YYYY-MM-DD, a ``from`` after
    ``to``, or a range longer than ``MAX_DAYS`` days."""
    last = today if raw_to is None else _day(raw_to, "to")
    first = last - timedelta(days=DEFAULT_DAYS - 1) if raw_from is None else _day(raw_from, "from")
    if first > last:
        raise invalid("from must not be after to", "from")
    if (last - first).days + 1 > MAX_DAYS:
        raise invalid(f"the range may span at most {MAX_DAYS} days", "from")
    return first, last


def _day(raw: str, param: str) -> date:
    try:
        if len(raw) != len("2026-01-31"):
            raise ValueError(raw)
        return date.fromisoformat(raw)
    except ValueError:
        raise invalid(f"{param} must be a date, YYYY-MM-DD", param) from None
