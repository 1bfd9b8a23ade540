"""The notifier's HTTP side against a real local server (loopback, allow-list opened):
a capped read of the receiver's reply, and one deadline over DNS and the POST."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from relay_batches.netguard import parse_networks
from relay_batches.services.notifier import http
from relay_batches.services.notifier.http import MAX_REPLY_BYTES, guarded_poster

LOOPBACK = parse_networks("127.0.0.0/8")
TIMEOUT_S = 1.0
SLOW_S = 0.6  # each step alone fits in TIMEOUT_S; both together do not


class Receiver:
    """HTTP routes for a misbehaving webhook receiver, and what it observed."""

    def __init__(self) -> None:
        self.hung_up = asyncio.Event()

    async def endless(self, request: web.Request) -> web.StreamResponse:
        """200, then a body that never ends (until the client hangs up)."""
        await request.read()
        response = web.StreamResponse(status=200)
        await response.prepare(request)
        chunk = b"x" * 65536
        try:
            while True:
                await response.write(chunk)
        except (ConnectionError, asyncio.CancelledError):
            self.hung_up.set()  # aiohttp cancels a handler whose client has gone
            raise

    async def slow(self, request: web.Request) -> web.Response:
        """204 after ``SLOW_S`` (a receiver that takes its time, within the timeout)."""
        await request.read()
        await asyncio.sleep(SLOW_S)  # the latency under test, not a synchronisation
        return web.Response(status=204)

    async def small(self, request: web.Request) -> web.Response:
        """An ordinary reply with a short body."""
        await request.read()
        return web.Response(status=202, text="accepted")


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    """The receiver on a free loopback port, and its base URL."""
    hooks = Receiver()
    app = web.Application()
    app.router.add_post("/endless", hooks.endless)
    app.router.add_post("/slow", hooks.slow)
    app.router.add_post("/small", hooks.small)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield hooks, f"127.0.0.1:{server.port}"
    await server.close()


def slow_lookup(delay_s: float) -> http.Lookup:
    """A resolver that takes ``delay_s`` to answer 127.0.0.1 for any host."""

    async def lookup(host: str, port: int) -> list[tuple[int, str]]:
        await asyncio.sleep(delay_s)  # DNS latency under test
        return [(socket.AF_INET, "127.0.0.1")]

    return lookup


async def test_an_endless_reply_is_read_only_up_to_the_cap(
    receiver: tuple[Receiver, str],
) -> None:
    hooks, host = receiver
    post = guarded_poster(LOOPBACK, 10.0)
    result = await asyncio.wait_for(post(f"http://{host}/endless", b"{}", {}), 10.0)
    # Reading the whole reply would never end: the POST would time out instead.
    assert (result.status_code, result.error) == (200, None)
    assert result.delivered
    await asyncio.wait_for(hooks.hung_up.wait(), 10.0)


async def test_a_short_reply_is_read_whole(receiver: tuple[Receiver, str]) -> None:
    _, host = receiver
    result = await guarded_poster(LOOPBACK, 10.0)(f"http://{host}/small", b"{}", {})
    assert (result.status_code, result.error) == (202, None)


class Source:
    """Stands in for a response body stream: endless 10,000-byte chunks."""

    def __init__(self) -> None:
        self.given = 0

    async def read(self, n: int) -> bytes:
        chunk = b"y" * min(n, 10_000)
        self.given += len(chunk)
        return chunk


async def test_read_capped_stops_at_the_limit() -> None:
    source = Source()
    assert await http._read_capped(source, MAX_REPLY_BYTES) == MAX_REPLY_BYTES  # type: ignore[arg-type]
    assert source.given == MAX_REPLY_BYTES == 64 * 1024


async def test_dns_and_post_share_one_deadline(receiver: tuple[Receiver, str]) -> None:
    _, host = receiver
    port = host.rsplit(":", 1)[1]
    url = f"http://hooks.example:{port}/slow"
    # Either step alone fits within the timeout ...
    fast_dns = guarded_poster(LOOPBACK, TIMEOUT_S, slow_lookup(0))
    assert (await fast_dns(url, b"{}", {})).status_code == 204
    # ... but together they take longer than the one deadline allows.
    slow_dns = guarded_poster(LOOPBACK, TIMEOUT_S, slow_lookup(SLOW_S))
    result = await slow_dns(url, b"{}", {})
    assert result.status_code is None
    assert result.error == f"timed out after {TIMEOUT_S:g}s"
    assert not result.refused


async def test_a_lookup_that_never_answers_times_out() -> None:
    never = asyncio.Event()

    async def lookup(host: str, port: int) -> list[tuple[int, str]]:
        await never.wait()
        raise AssertionError("unreachable")

    result = await guarded_poster(LOOPBACK, 0.2, lookup)("http://hooks.example/x", b"{}", {})
    assert result.error == "timed out after 0.2s"


async def test_a_failed_lookup_is_refused() -> None:
    async def lookup(host: str, port: int) -> list[tuple[int, str]]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    result = await guarded_poster(LOOPBACK, 1.0, lookup)("http://nowhere.example/x", b"{}", {})
    assert result.refused
    assert result.error is not None and result.error.startswith("refused: cannot resolve")
