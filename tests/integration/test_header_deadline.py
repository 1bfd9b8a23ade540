"""A new connection whose request line and headers never complete is closed after the
header deadline (``RELAY_HEADER_TIMEOUT_S``), a kept-alive one after the keep-alive time
(``RELAY_KEEPALIVE_S``) from its previous response, and one process holds at most
``RELAY_MAX_CONNECTIONS`` connections: a trickle of header bytes cannot hold the API."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest
from aiohttp.test_utils import TestServer

from relay_batches.bus.client import Bus
from relay_batches.ledger.jobs import JobStore
from relay_batches.router.aliases import AliasTable
from tests.helpers.api import start_api
from tests.helpers.support import wait_until

DEADLINE_S = 1.0
KEEPALIVE_S = 3.0
MARGIN_S = 1.5
MAX_CONNECTIONS = 4
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
async def short_server(
    pool: asyncpg.Pool, bus: Bus, aliases: AliasTable
) -> AsyncIterator[TestServer]:
    """The API with a one-second header deadline and room for four connections."""
    server = await start_api(
        pool,
        bus,
        aliases,
        JobStore(pool),
        header_timeout_s=DEADLINE_S,
        keepalive_s=KEEPALIVE_S,
        max_connections=MAX_CONNECTIONS,
    )
    yield server
    await server.close()


async def connect(server: TestServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw TCP connection to ``server``."""
    assert server.port is not None
    return await asyncio.open_connection("127.0.0.1", server.port)


async def trickle(writer: asyncio.StreamWriter, data: bytes, every_s: float) -> None:
    """Write ``data`` one byte every ``every_s``, until written or the peer is gone."""
    with contextlib.suppress(ConnectionError):
        for i in range(len(data)):
            writer.write(data[i : i + 1])
            await writer.drain()
            await asyncio.sleep(every_s)


async def closed_after(reader: asyncio.StreamReader, timeout_s: float) -> float:
    """Seconds until the server closes the connection without a byte of response
    (a 408 would be a response too: then its status line is returned in the error)."""
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(timeout_s):
        with contextlib.suppress(ConnectionError):
            data = await reader.read(1024)
            assert data == b"" or data.startswith(b"HTTP/1.1 408"), data
    return asyncio.get_running_loop().time() - started


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(REQUEST[:-2] + b"X-Slow: " + b"a" * 100, id="trickled"),
        pytest.param(b"", id="nothing-sent"),
    ],
)
async def test_headers_unfinished_at_the_deadline_are_closed(
    short_server: TestServer, headers: bytes
) -> None:
    reader, writer = await connect(short_server)
    sender = asyncio.create_task(trickle(writer, headers, 0.3))
    try:
        elapsed = await closed_after(reader, DEADLINE_S + MARGIN_S)
    finally:
        sender.cancel()
        writer.close()
    assert elapsed >= DEADLINE_S - 0.2, elapsed


async def read_response(reader: asyncio.StreamReader) -> bytes:
    """One whole response (status line, headers and its ``Content-Length`` body); its
    status code is returned."""
    async with asyncio.timeout(5):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
    return head.split()[1]


async def test_a_kept_alive_connection_outlives_the_header_deadline(
    short_server: TestServer,
) -> None:
    reader, writer = await connect(short_server)
    try:
        writer.write(REQUEST)
        assert await read_response(reader) == b"200"
        await asyncio.sleep(DEADLINE_S + 0.5)  # idle past the first request's deadline
        writer.write(REQUEST)
        assert await read_response(reader) == b"200"
    finally:
        writer.close()


async def test_trickled_headers_of_a_kept_alive_connection_are_closed_after_keepalive(
    short_server: TestServer,
) -> None:
    reader, writer = await connect(short_server)
    writer.write(REQUEST)
    assert await read_response(reader) == b"200"
    sender = asyncio.create_task(trickle(writer, REQUEST[:-2] + b"X-Slow: " + b"a" * 100, 0.3))
    try:
        elapsed = await closed_after(reader, KEEPALIVE_S + MARGIN_S)
    finally:
        sender.cancel()
        writer.close()
    assert elapsed >= KEEPALIVE_S - 0.3, elapsed


async def test_slow_headers_complete_within_the_deadline_are_served(
    short_server: TestServer,
) -> None:
    reader, writer = await connect(short_server)
    try:
        await trickle(writer, REQUEST, DEADLINE_S / 2 / len(REQUEST))
        async with asyncio.timeout(5):
            status_line = await reader.readline()
    finally:
        writer.close()
    assert status_line.split()[1] == b"200", status_line


async def test_connections_past_the_bound_are_closed_at_accept(short_server: TestServer) -> None:
    assert short_server.runner is not None and short_server.runner.server is not None
    server = short_server.runner.server

    async def open_count(count: int) -> bool:
        return len(server.connections) == count

    await wait_until(lambda: open_count(0), 5, "earlier connections to close")
    held = [await connect(short_server) for _ in range(MAX_CONNECTIONS)]
    try:
        await wait_until(lambda: open_count(MAX_CONNECTIONS), 0.5, "the connections accepted")
        reader, writer = await connect(short_server)
        try:
            assert await closed_after(reader, DEADLINE_S / 2) < DEADLINE_S / 2
        finally:
            writer.close()
        held.pop()[1].close()
        await wait_until(lambda: open_count(MAX_CONNECTIONS - 1), 0.5, "one connection closed")
        reader, writer = await connect(short_server)
        try:
            writer.write(REQUEST)
            async with asyncio.timeout(DEADLINE_S):
                assert (await reader.readline()).split()[1] == b"200"
        finally:
            writer.close()
    finally:
        for _, held_writer in held:
            held_writer.close()
