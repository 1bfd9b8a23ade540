"""Raw-socket upstreams for the HTTP client's tests: servers that say exactly the bytes a
test gives, misbehaving ones included, and a way to run a scenario on both loops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import uvloop

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Scenario = Callable[[], Awaitable[None]]


def on_both_loops(scenario: Scenario) -> None:
    """Run ``scenario`` on asyncio's default loop, then on uvloop (the services' loop)."""
    asyncio.run(scenario())
    uvloop.run(scenario())


async def raw_server(handle: Handler) -> tuple[asyncio.Server, str]:
    """A local server calling ``handle`` per connection, and a URL of it."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request (head and a ``Content-Length`` body) off the connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.startswith(b"Content-Length")
    )
    return head + await reader.readexactly(length)


@dataclass
class Served:
    """A server of :func:`serving`: its URL and how many connections it has taken."""

    url: str
    connections: int = 0


@contextlib.asynccontextmanager
async def serving(handle: Handler) -> AsyncIterator[Served]:
    """``handle`` served on a local port for the block; on leaving, handlers still
    running are cancelled and their connections closed."""
    running: set[asyncio.Task[None]] = set()
    writers: list[asyncio.StreamWriter] = []
    served = Served("")

    async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        running.add(task)
        writers.append(writer)
        served.connections += 1
        try:
            with contextlib.suppress(asyncio.CancelledError):  # cancelled when the block ends
                await handle(reader, writer)
        finally:
            running.discard(task)

    server, served.url = await raw_server(tracked)
    try:
        yield served
    finally:
        server.close()
        for task in list(running):
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        for writer in writers:
            writer.transport.abort()
        await server.wait_closed()
