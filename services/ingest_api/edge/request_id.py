"""``X-Request-Id``: each request's id, taken from the caller or made here, on every
response of the API (every surface, the panel, the probes, errors and streamed bodies
alike) and in every log line written while the request is served.

A caller's id is kept when it is 1 to :data:`MAX_LENGTH` characters of a safe set
(letters, digits and ``-_.:@+=/``), so it cannot forge log fields or headers; any other
value, or none, is replaced by a fresh 32-hex id.
"""

from __future__ import annotations

import re

from aiohttp import web

from relay_batches.ids import new_id
from relay_batches.logging import request_id_context
from relay_batches.services.ingest_api.edge.middleware import Handler

HEADER = "X-Request-Id"
MAX_LENGTH = 128
_SAFE = re.compile(rf"[A-Za-z0-9\-_.:@+=/]{{1,{MAX_LENGTH}}}")
REQUEST_ID = web.RequestKey("request_id", str)


def accepted_request_id(given: str | None) -> str:
    """``given`` when it is a safe id, else a new one."""
    if given is not None and _SAFE.fullmatch(given):
        return given
    return new_id()


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Give the request its id and serve it with the id in every log line's context."""
    request_id = accepted_request_id(request.headers.get(HEADER))
    request[REQUEST_ID] = request_id
    with request_id_context(request_id):
        return await handler(request)


async def send_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: the request's id on the response, before its headers go."""
    request_id = request.get(REQUEST_ID)
    if request_id is None:  # answered before any middleware ran
        request_id = request[REQUEST_ID] = accepted_request_id(request.headers.get(HEADER))
    response.headers[HEADER] = request_id
