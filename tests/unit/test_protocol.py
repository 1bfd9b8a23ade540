"""The aiohttp internals :mod:`relay_batches.services.ingest_api.edge.protocol` relies on.

``ApiRunner`` overrides ``AppRunner._make_server`` (private) and re-classes the server it
returns, whose ``__call__`` builds connections from ``Server._loop`` and
``Server._kwargs`` (private too). An aiohttp release that renames any of them would not
break the server, only quietly bring back aiohttp's plain-text protocol errors; these
tests fail loudly instead (``pyproject.toml`` bounds aiohttp to the versions checked).
"""

from __future__ import annotations

import inspect

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from relay_batches.services.ingest_api.edge.protocol import (
    ApiRequestHandler,
    ApiRunner,
    ApiServer,
)


def test_the_private_hooks_still_exist_with_the_shapes_used() -> None:
    assert inspect.iscoroutinefunction(web.AppRunner._make_server)
    assert list(inspect.signature(web.AppRunner._make_server).parameters) == ["self"]
    handle_error = inspect.signature(RequestHandler.handle_error).parameters
    assert list(handle_error) == ["self", "request", "status", "exc", "message"]


async def test_the_runner_serves_with_the_api_request_handler() -> None:
    runner = ApiRunner(web.Application(), access_log=None)
    await runner.setup()
    try:
        server = runner.server
        assert type(server) is ApiServer
        assert isinstance(server._kwargs, dict) and server._loop is not None
        handler = server()
        assert type(handler) is ApiRequestHandler
        assert handler.handle_error.__func__ is ApiRequestHandler.handle_error  # type: ignore[attr-defined]
    finally:
        await runner.cleanup()
