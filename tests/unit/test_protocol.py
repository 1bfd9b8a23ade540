"""The aiohttp names :mod:`relay_batches.services.ingest_api.edge.protocol` relies on.

aiohttp has no supported way to render the requests its parser refuses, so ``ApiRunner``
keeps one hook: after aiohttp's ``AppRunner.setup`` it gives ``runner.server`` the class
:class:`ApiServer`, whose protocol factory gives each handler aiohttp builds the class
:class:`ApiRequestHandler` (``RequestHandler`` with ``handle_error`` overridden). Only
public names are used, but an aiohttp release that changed one would not break the
server, only quietly bring back aiohttp's plain-text protocol errors (or, for a handler
whose layout grew, refuse the class change); these tests fail loudly instead.
"""

from __future__ import annotations

import inspect
from unittest import mock

import orjson
from aiohttp import web
from aiohttp.http_exceptions import BadStatusLine, ContentEncodingError, LineTooLong
from aiohttp.test_utils import make_mocked_request

from relay_batches.services.ingest_api.edge.protocol import (
    ApiRequestHandler,
    ApiRunner,
    ApiServer,
    protocol_error,
)


def test_the_hooked_names_still_exist_with_the_shapes_used() -> None:
    assert inspect.iscoroutinefunction(web.AppRunner.setup)
    assert isinstance(inspect.getattr_static(web.AppRunner, "server"), property)
    handle_error = inspect.signature(web.RequestHandler.handle_error).parameters
    assert list(handle_error) == ["self", "request", "status", "exc", "message"]
    assert ApiRequestHandler.__slots__ == ()  # a class change keeps every slot
    connection_made = inspect.signature(web.Server.connection_made).parameters
    assert list(connection_made) == ["self", "handler", "transport"]
    assert isinstance(inspect.getattr_static(web.Server, "connections"), property)
    assert isinstance(inspect.getattr_static(web.RequestHandler, "keepalive_timeout"), property)


async def test_the_runner_serves_with_the_api_request_handler() -> None:
    runner = ApiRunner(web.Application(), access_log=None)
    await runner.setup()
    try:
        server = runner.server
        assert type(server) is ApiServer
        handler = server()
        assert type(handler) is ApiRequestHandler
        assert handler.handle_error.__func__ is ApiRequestHandler.handle_error  # type: ignore[attr-defined]
        # aiohttp built it with the runner's arguments, as it does without the hook
        assert handler.access_logger is None
    finally:
        await runner.cleanup()


async def test_the_runner_sets_the_header_deadline_and_the_connection_bound() -> None:
    runner = ApiRunner(web.Application(), header_timeout_s=7.5, keepalive_s=30.0, max_connections=3)
    await runner.setup()
    try:
        server = runner.server
        assert isinstance(server, ApiServer) and server.max_connections == 3
        assert server.header_timeout_s == 7.5  # a new connection's first headers
        # later requests' headers, and idle kept-alive connections
        assert server().keepalive_timeout == 30.0
    finally:
        await runner.cleanup()


async def test_the_handler_answers_with_the_error_object_and_closes() -> None:
    runner = ApiRunner(web.Application(), access_log=None)
    await runner.setup()
    try:
        assert runner.server is not None
        handler = runner.server()
        writer = mock.Mock(output_size=0)  # nothing of a response sent yet
        request = make_mocked_request("GET", "/", writer=writer)
        response = handler.handle_error(request, 400, BadStatusLine("G(T"))
        assert isinstance(response, web.Response) and response.text is not None
        assert (response.status, response.content_type) == (400, "application/json")
        assert orjson.loads(response.text)["error"]["type"] == "invalid_request_error"
        assert response.keep_alive is False
    finally:
        await runner.cleanup()


def test_each_refusal_has_its_status_and_message() -> None:
    def rendered(status: int, exc: BaseException | None) -> tuple[int, dict[str, object]]:
        response = protocol_error(status, exc)
        assert response.text is not None
        return response.status, orjson.loads(response.text)["error"]

    status, error = rendered(400, ContentEncodingError("br"))
    assert (status, error["param"]) == (415, "Content-Encoding")
    status, error = rendered(400, LineTooLong("line", "8190", "9000"))
    assert (status, error["message"]) == (400, "request line or header too long")
    status, error = rendered(400, BadStatusLine("G(T\x00"))
    assert status == 400
    assert str(error["message"]).startswith("malformed HTTP request:")
    assert "\x00" not in str(error["message"])
    status, error = rendered(500, RuntimeError("boom"))
    assert (status, error["message"]) == (500, "internal error")
