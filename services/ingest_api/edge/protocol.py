"""Requests aiohttp refuses before any handler runs, answered with the API's error object.

aiohttp's parser answers a malformed request itself (a request line or header over its
size limits, a bad method or request line, an invalid header, a ``Content-Encoding``
it cannot inflate) through ``RequestHandler.handle_error``, in plain text. The
application's middlewares never see those requests, so this module gives the server a
request handler whose ``handle_error`` renders API.md's error object instead.
:class:`ApiRunner` is the ``AppRunner`` that serves with it.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler
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


class ApiRequestHandler(RequestHandler):
    """aiohttp's connection handler, answering its own errors as the API's error object."""

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


class ApiServer(web.Server):
    """aiohttp's low-level server, building :class:`ApiRequestHandler` connections."""

    def __call__(self) -> RequestHandler:
        return ApiRequestHandler(self, loop=self._loop, **self._kwargs)


class ApiRunner(web.AppRunner):
    """``AppRunner`` whose server answers protocol errors with the API's error object."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = ApiServer  # the app's own Server, built by aiohttp as usual
        return server
