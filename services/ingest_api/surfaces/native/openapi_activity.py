"""The OpenAPI paths of :mod:`.activity`: a job's timeline and the workspace's usage."""

from __future__ import annotations

from typing import Any

from relay_batches.ledger.timeline import MAX_EVENTS
from relay_batches.ledger.usage import MAX_DAYS
from relay_batches.services.ingest_api.surfaces.native import outcomes
from relay_batches.services.ingest_api.surfaces.native.activity import DEFAULT_DAYS
from relay_batches.services.ingest_api.surfaces.native.document import json, operation, query

_DAY = {"type": "string", "format": "date"}
_FROM = f"The first day; default {DEFAULT_DAYS - 1} days before `to`."
_TO = f"The last day, included (default today); {MAX_DAYS} days at most."


def timeline_path() -> dict[str, Any]:
    """``/v1/batches/{id}/timeline`` (its ``{id}`` parameter added by the caller)."""
    return {
        "get": operation(
            "getBatchTimeline",
            "What happened to the batch, dated",
            {"200": json(outcomes.BatchTimeline, "The events, oldest first.")},
            (404,),
            description="Created, started, each pause and resume, budget reached, finished"
            " (with the status it ended as) and every attempt of its completion webhook;"
            f" at most {MAX_EVENTS} events (`has_more` says when there are more).",
        )
    }


def usage_path() -> dict[str, Any]:
    """``/v1/usage``."""
    return {
        "get": operation(
            "getUsage",
            "Rows, tokens and cost per day and model",
            {"200": json(outcomes.Usage, "The sums, by day then model.")},
            (400,),
            description="The workspace's jobs created in the range (whole UTC days), summed"
            " per day and job-level model from each job's counters; a cron template does not"
            " count, its runs do. Days without jobs are left out.",
            parameters=[
                query("from", _FROM, _DAY),
                query("to", _TO, _DAY),
            ],
            tag="usage",
        )
    }


def workers_path() -> dict[str, Any]:
    """``/v1/workers``."""
    return {
        "get": operation(
            "getWorkers",
            "Row-workers, queues and throttled deployments, live",
            {"200": json(outcomes.Workers, "What the fleet is doing now.")},
            (),
            description="Every live row-worker (from its heartbeats) with the rows it holds:"
            " this workspace's per job, other workspaces' as a count; the depth and consumers"
            " of the dispatch, rows, results, notify and dead-letter queues (read at most"
            " once a second); and the deployments that answered 429 in the last minute.",
            tag="usage",
        )
    }
