"""Requests aiohttp refuses before any handler runs, answered with the API's error object.

aiohttp's parser answers a malformed request itself (a request line or header over its
size limits, a bad method or request line, an invalid header, a ``Content-Encoding``
it cannot inflate) through ``RequestHandler.handle_error``, in plain text. The
application and its middlewares never see those requests, and aiohttp offers no
setting, signal or middleware for them (aio-libs/aiohttp#3287, open since 2018).

So the one hook left is that method: :class:`ApiRequestHandler` overrides it to render
the native error object (docs/api/native.md). aiohttp builds each connection's handler
from arguments it keeps private, so :class:`ApiServer` takes the handler aiohttp built
and gives it this class (a subclass adding no state: only the one method differs), and
:class:`ApiRunner` is the ``AppRunner`` whose server (``runner.server``, public) is an
:class:`ApiServer`.
Three bounds are set here too. The header deadline (:class:`ApiServer`): a new
connection whose request line and headers are not complete ``header_timeout_s`` after it
opened is closed (a timer armed at accept, disarmed when aiohttp builds the request from
complete headers, through the server's public ``request_factory``; bytes trickling in do
not move it). Later requests on a kept-alive connection are bounded by aiohttp's
``keepalive_timeout`` (``keepalive_s``), whose timer starts when a response ends and
closes the connection if no complete request line and headers arrived by then; to get
there a client must have sent a whole request. The connection bound is
:meth:`ApiServer.connection_made`: past ``max_connections`` a new connection is closed as
it is accepted, before any byte is read.

Only public aiohttp names are used; ``tests/unit/test_protocol.py`` checks each of
them, so an aiohttp release that changed one fails there rather than in production.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError, LineTooLong
from aiohttp.web_request import BaseRequest

from relay_batches.services.ingest_api.surfaces.native.errors import error_response

log = logging.getLogger("relay.ingest_api")


def protocol_error(status: int, exc: BaseException | None) -> web.Response:
    """The error object answering a request aiohttp could not parse (or a 500)."""
    if isinstance(exc, ContentEncodingError):
        return error_response(
            415, "Content-Encoding must be gzip, deflate or identity", "Content-Encoding"
        )
    if isinstance(exc, LineTooLong):
        return error_response(400, "request line or header too long")
    if isinstance(exc, HttpProcessingError):
        return error_response(status, f"malformed HTTP request: {_printable(exc.message)}")
    return error_response(500 if status >= 500 else status, "internal error")


def _printable(text: str, limit: int = 200) -> str:
    return "".join(ch for ch in text[:limit] if ch.isprintable())


class ApiRequestHandler(web.RequestHandler):
    """aiohttp's connection handler, answering its own errors as the API's error object."""

    __slots__ = ()  # aiohttp's handler with one method changed, never more state

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The error object for ``exc``; the connection is closed after it."""
        if request.writer.output_size > 0:  # a response has begun: only a reset is left
            return super().handle_error(request, status, exc, message)
        log.warning("protocol_error", extra={"status": status, "error": repr(exc)[:300]})
        response = protocol_error(status, exc)
        response.force_close()
        return response


DEFAULT_HEADER_TIMEOUT_S = 10.0  # services pass the settings
DEFAULT_KEEPALIVE_S = 75.0  # aiohttp's own keep-alive default
DEFAULT_MAX_CONNECTIONS = 10_000
REFUSED_LOG_EVERY_S = 1.0


class ApiServer(web.Server):
    """aiohttp's server, whose connections are :class:`ApiRequestHandler` s, at most
    ``max_connections`` of them, each closed if its first request's headers are not
    complete ``header_timeout_s`` after it opened."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    # Connections whose first request's headers are not complete yet, and their timers.
    header_deadlines: dict[web.RequestHandler, asyncio.TimerHandle]
    make_request: Any  # aiohttp's own request factory, wrapped by :meth:`headers_complete`
    # Refusals since the last log line: a flood of connections is one line a second.
    refused: int = 0
    refused_logged_at: float = 0.0

    def connection_made(self, handler: web.RequestHandler, transport: asyncio.Transport) -> None:
        """Count the connection in, or close it when ``max_connections`` are open."""
        if len(self.connections) >= self.max_connections:
            transport.close()
            self.refused += 1
            now = time.monotonic()
            if now - self.refused_logged_at >= REFUSED_LOG_EVERY_S:
                log.warning(
                    "connection_refused",
                    extra={"open": self.max_connections, "refused": self.refused},
                )
                self.refused, self.refused_logged_at = 0, now
            return
        super().connection_made(handler, transport)
        self.header_deadlines[handler] = asyncio.get_running_loop().call_later(
            self.header_timeout_s, self._header_deadline_passed, handler
        )

    def connection_lost(
        self, handler: web.RequestHandler, exc: BaseException | None = None
    ) -> None:
        """Forget the connection's header deadline, then aiohttp's own bookkeeping."""
        deadline = self.header_deadlines.pop(handler, None)
        if deadline is not None:
            deadline.cancel()
        super().connection_lost(handler, exc)

    def _header_deadline_passed(self, handler: web.RequestHandler) -> None:
        if self.header_deadlines.pop(handler, None) is not None:
            log.info("header_deadline_passed", extra={"after_s": self.header_timeout_s})
            handler.force_close()

    def headers_complete(self, message: Any, payload: Any, protocol: Any, *args: Any) -> Any:
        """aiohttp's request factory, called once a request's line and headers are
        parsed: the connection's header deadline is met."""
        deadline = self.header_deadlines.pop(protocol, None)
        if deadline is not None:
            deadline.cancel()
        return self.make_request(message, payload, protocol, *args)

    def __call__(self) -> web.RequestHandler:
        """A connection's handler, built by aiohttp as usual (its arguments, its checks)."""
        handler = super().__call__()
        handler.__class__ = ApiRequestHandler
        return handler


class ApiRunner(web.AppRunner):
    """``AppRunner`` whose server answers protocol errors with the API's error object,
    closes a new connection whose headers take over ``header_timeout_s`` (a kept-alive one
    whose next request's headers are not complete ``keepalive_s`` after the previous
    response) and holds at most ``max_connections``."""

    def __init__(
        self,
        app: web.Application,
        *,
        header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, keepalive_timeout=keepalive_s, **kwargs)
        self._max_connections = max_connections
        self._header_timeout_s = header_timeout_s

    async def setup(self) -> None:
        """aiohttp's setup (the application started, its server built), then that
        server made an :class:`ApiServer`."""
        await super().setup()
        server = self.server
        assert server is not None  # set by a setup that returned
        server.__class__ = ApiServer
        assert isinstance(server, ApiServer)
        server.max_connections = self._max_connections
        server.header_timeout_s = self._header_timeout_s
        server.header_deadlines = {}
        server.make_request = server.request_factory
        server.request_factory = server.headers_complete
