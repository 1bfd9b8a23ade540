"""The one create sequence every surface calls, with its own translation in front.

Whatever the surface, creating batches is the same steps, in this order:

1. admit the body (a large one holds a slot of :class:`.edge.body.BodyGate` until the
   end) and read it (:attr:`Creation.read`: JSON, or a multipart form spooled to disk);
2. claim its ``Idempotency-Key`` over what the request asked for
   (:attr:`Creation.claimed`) and, when the key was used before, answer with that
   first request's batch (:attr:`Creation.replay`);
3. translate and validate it into planned jobs (:attr:`Creation.plan`: CPU-bound, run
   in the parser executor, so the event loop never decodes a large body);
4. store them with the claim in one transaction (:attr:`Creation.store`); a concurrent
   twin that won the key gives its answer instead (:attr:`Creation.raced`);
5. count and announce each new job (:func:`.submit.announce_created`), then answer in
   the surface's shape (:attr:`Creation.answer`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

from aiohttp import web

from relay_batches.errors import ApiError
from relay_batches.ledger.idempotency import IdempotencyClaim, KeyTaken
from relay_batches.model import Job
from relay_batches.services.ingest_api.deps import DEPS, ApiDeps
from relay_batches.services.ingest_api.edge.body import BodyTicket, read_body
from relay_batches.services.ingest_api.edge.idempotency import (
    HEADER,
    claim_for,
    raced_response,
    stored_response,
)
from relay_batches.services.ingest_api.edge.middleware import WORKSPACE_ID
from relay_batches.services.ingest_api.submit import announce_created
from relay_batches.services.ingest_api.traced import describe_submit, submit_span

Body = TypeVar("Body")  # what a surface reads from the request
Plan = TypeVar("Plan")  # what it plans from the body
Stored = TypeVar("Stored")  # what storing the plan gives back
JSON = "application/json"
Replay = Callable[[web.Request, ApiDeps, IdempotencyClaim], Awaitable[web.Response | None]]


async def replay_stored(
    request: web.Request, deps: ApiDeps, claim: IdempotencyClaim
) -> web.Response | None:
    """The first response for ``claim``'s key as it was stored; None for a new key."""
    return await stored_response(deps.idempotency, claim)


async def raced_stored(
    request: web.Request, deps: ApiDeps, claim: IdempotencyClaim
) -> web.Response | None:
    """After :class:`KeyTaken`: the stored response of the twin that won the key."""
    return await raced_response(deps.idempotency, claim)


@dataclass(frozen=True)
class Creation(Generic[Body, Plan, Stored]):
    """A surface's translation in front of :func:`create` (each step: module docstring)."""

    read: Callable[[web.Request, ApiDeps, BodyTicket, ExitStack], Awaitable[Body]]
    claimed: Callable[[Body], bytes | bytearray]  # what Idempotency-Key's hash covers
    plan: Callable[[Body, ApiDeps, str, datetime], Plan]
    store: Callable[[ApiDeps, Plan, IdempotencyClaim | None, bool], Awaitable[Stored]]  # large?
    jobs: Callable[[Stored], Sequence[Job]]  # the jobs it created, to announce
    answer: Callable[[web.Request, Stored], web.Response]
    replay: Replay = replay_stored
    raced: Replay = raced_stored  # None: 409, the key is held by a request still running


async def create(request: web.Request, how: Creation[Body, Plan, Stored]) -> web.Response:
    """Create what ``request`` asks for through the surface's ``how`` (module docstring),
    in the submit's span (:mod:`.traced`: the jobs it stores keep its trace context)."""
    with submit_span(request, request[WORKSPACE_ID]) as span:
        response, jobs = await _create(request, how)
        describe_submit(span, jobs, response)
        return response


async def _create(
    request: web.Request, how: Creation[Body, Plan, Stored]
) -> tuple[web.Response, Sequence[Job]]:
    deps = request.app[DEPS]
    workspace_id = request[WORKSPACE_ID]
    async with deps.body_gate.admit(workspace_id) as ticket:  # a large body holds its slot
        with ExitStack() as resources:  # whatever the body was spooled to
            body = await how.read(request, deps, ticket, resources)
            claim = claim_for(request, workspace_id, how.claimed(body))
            replayed = None if claim is None else await how.replay(request, deps, claim)
            if replayed is not None:
                return replayed, ()
            now = datetime.now(UTC)
            loop = asyncio.get_running_loop()
            planned = await loop.run_in_executor(
                deps.parser_for(ticket.large), how.plan, body, deps, workspace_id, now
            )
            del body  # the planned rows are all that is kept while they are stored
            try:
                stored = await how.store(deps, planned, claim, ticket.large)
            except KeyTaken:
                assert claim is not None  # only a claimed key is ever taken
                raced = await how.raced(request, deps, claim)
                if raced is None:
                    raise ApiError(409, "a concurrent request holds this key", HEADER) from None
                return raced, ()
    jobs = how.jobs(stored)
    for job in jobs:
        await announce_created(deps, job)
    return how.answer(request, stored), jobs


async def read_json(
    request: web.Request, deps: ApiDeps, ticket: BodyTicket, _: ExitStack
) -> bytearray:
    """A JSON body of at most ``RELAY_MAX_JSON_BODY_BYTES``, read whole."""
    return await read_body(request, JSON, deps.max_json_body_bytes, ticket)


def as_read(body: bytearray) -> bytearray:
    """A JSON body's claim: its bytes as they were sent."""
    return body


def one_job(job: Job) -> Sequence[Job]:
    """The one job a create stored, to announce."""
    return (job,)
