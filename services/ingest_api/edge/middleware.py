"""HTTP edge mechanics shared by every surface: the error middleware (each surface gives
it its own error object), key auth, the schema gate, timing.

Three surfaces share one server and one ledger, each an aiohttp sub-application with its
own middlewares (see :mod:`..app`): the native API under ``/v1/``, the OpenAI-compatible
one under ``/openai/v1/`` and the Anthropic-compatible one under ``/anthropic/v1/``.
Every one of them answers failures in its own :data:`ErrorShape` and requires a Relay
API key; what is outside them (the probes, the panel, the document) answers in the
native error object and needs no key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web
from aiohttp.typedefs import Middleware

from relay_batches.errors import ERROR_TYPES, ApiError, TransientError
from relay_batches.metrics import HTTP_LATENCY

log = logging.getLogger("relay.ingest_api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ResolveKey = Callable[[str], Awaitable[str | None]]
# A surface's error object: ``(status, message, param) -> body``.
ErrorShape = Callable[[int, str, str | None], dict[str, object]]

WORKSPACE_ID = web.RequestKey("workspace_id", str)  # the caller's workspace, set by auth
STREAMING = web.RequestKey("streaming", bool)  # True once a streamed body has begun


def json_response(data: object, status: int = 200) -> web.Response:
    """A JSON response encoded with orjson."""
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


RETRY_AFTER_S = 2
UNAVAILABLE = "service temporarily unavailable, retry shortly"


def error_type(status: int) -> str:
    """The native and OpenAI error ``type`` of ``status``."""
    return ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "internal_error")


def encodable(text: str) -> str:
    """``text`` with any lone surrogate (from a key or value of a payload not built by
    orjson) written as its backslash escape, so every error object can be encoded."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(status: int, message: str, param: str | None, shape: ErrorShape) -> web.Response:
    """``shape``'s error object with ``status``; a 503 says when to retry
    (``Retry-After``)."""
    body = shape(status, encodable(message), None if param is None else encodable(param))
    response = json_response(body, status)
    if status == 503:
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


_HTTP_MESSAGES = {
    404: "no such route",
    405: "method not allowed on this route",
    413: "request body too large",
}


@web.middleware
async def timing_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Observe every request's latency by method, route and status (the whole server's,
    once per request, whichever application answers it)."""
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        route = request.match_info.route.resource
        name = route.canonical if route is not None else "unmatched"
        HTTP_LATENCY.labels(request.method, name, str(status)).observe(
            time.perf_counter() - started
        )


def error_middleware(shape: ErrorShape) -> Middleware:
    """Turn every exception into ``shape``'s error object; never leak a stack trace.

    Once a streamed body has begun (:data:`STREAMING`), the status line and some of the
    body are on the wire: a second response would be written into the body and end it
    cleanly, so the failure is logged here and re-raised, and aiohttp aborts the
    connection; the client sees an incomplete transfer.
    """

    @web.middleware
    async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except StreamAborted:
            raise  # logged by the application that streamed
        except Exception as exc:
            if request.get(STREAMING, False):
                log.warning("stream_aborted", extra={"path": request.path, "error": repr(exc)})
                raise StreamAborted(request.path) from exc
            if isinstance(exc, web.HTTPException) and exc.status < 400:
                raise
            response = _error_for(request, exc, shape)
            if not request.content.is_eof():
                response.force_close()  # close rather than drain a body we refused
                # A stalled sender, or a body that cannot be decoded: waiting for the rest
                # of it helps nobody (and reading past a decode error would raise again).
                if response.status == 408 or request.content.exception() is not None:
                    await _send_and_close(request, response)
            return response

    return answer_errors


async def _send_and_close(request: web.Request, response: web.Response) -> None:
    """Send ``response`` now and close the connection once it is written, instead of
    aiohttp's lingering read of the unread body (up to 10 s)."""
    await response.prepare(request)
    await response.write_eof()
    if request.transport is not None:
        request.transport.close()  # flushes what is buffered, then closes


def _error_for(request: web.Request, exc: Exception, shape: ErrorShape) -> web.Response:
    """The error object answering ``exc`` (no response has been started)."""
    path = request.path
    if isinstance(exc, ApiError):
        return error_response(exc.status, exc.message, exc.param, shape)
    if isinstance(exc, web.HTTPException):
        message = _HTTP_MESSAGES.get(exc.status, exc.reason)
        return error_response(exc.status, message, None, shape)
    if isinstance(exc, TransientError):
        log.warning("dependency_unavailable", extra={"error": str(exc), "path": path})
        return error_response(503, UNAVAILABLE, None, shape)
    log.error("request_failed", exc_info=exc, extra={"path": path, "error": repr(exc)})
    return error_response(500, "internal error", None, shape)


class StreamAborted(Exception):
    """A streamed response failed after its headers were sent (logged as ``stream_aborted``)."""


class _AlreadyLogged(logging.Filter):
    """Drops aiohttp's own report of a :class:`StreamAborted`: it is logged once, by us."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StreamAborted))


def log_stream_aborts_once(server_logger: logging.Logger | None = None) -> None:
    """Keep aiohttp's server logger from reporting a stream abort a second time."""
    target = server_logger or logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _AlreadyLogged) for f in target.filters):
        target.addFilter(_AlreadyLogged())


def schema_middleware(current: Callable[[], Awaitable[bool]], shape: ErrorShape) -> Middleware:
    """Answer a surface's every request with 503 (in ``shape``) while the ledger's schema
    is behind this code's version (a migration has not run yet): every such request needs
    the ledger, keys included."""

    @web.middleware
    async def require_schema(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not await current():
            log.warning("schema_not_current", extra={"path": request.path})
            return error_response(503, UNAVAILABLE, None, shape)
        return await handler(request)

    return require_schema


def auth_middleware(resolve: ResolveKey) -> Middleware:
    """Require a Relay API key on a surface's every request; store the workspace id.

    The key comes as ``Authorization: Bearer <key>`` (every SDK's way but Anthropic's) or
    as ``x-api-key: <key>`` (Anthropic's); when both are sent, they must agree.
    """

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        key = _presented_key(request)
        if key is None:
            raise ApiError(
                401, "missing API key: send Authorization: Bearer <key> (or x-api-key: <key>)"
            )
        # Header bytes that are not UTF-8 arrive as surrogates: such a key cannot exist.
        workspace_id = await resolve(key) if key and _is_utf8(key) else None
        if workspace_id is None:
            raise ApiError(401, "invalid API key")
        request[WORKSPACE_ID] = workspace_id
        return await handler(request)

    return authenticate


def _presented_key(request: web.Request) -> str | None:
    """The key of the request's ``Authorization: Bearer`` or ``x-api-key`` header; ``""``
    when the two disagree (no key is both), None when neither is sent."""
    header = request.headers.get("Authorization", "")
    scheme, _, bearer = header.partition(" ")
    bearer = bearer.strip() if scheme.lower() == "bearer" else ""
    x_api_key = request.headers.get("x-api-key", "").strip()
    if bearer and x_api_key and bearer != x_api_key:
        return ""
    return bearer or x_api_key or None


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
