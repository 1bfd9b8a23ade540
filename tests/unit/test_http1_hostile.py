"""The upstream HTTP client against a hostile upstream (a provider endpoint, a proxy or a
compromised route): raw-socket servers that send replies nobody asked for, reset a reply
framed by the connection's end, send a million one-byte chunks, or a bare CR in a header.

Any HTTP/1.1 client that reuses connections reads a reply an upstream holds back and
sends late as the answer to the next request on that connection; what these tests hold
is that such a reply never crosses workspaces (connections are pooled per workspace and
origin), that one arriving on an idle connection closes it, and that what a hostile
upstream sends is refused or bounded, never taken as a complete reply it is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import time
from collections.abc import Callable

import orjson
import pytest
import uvloop

from relay_batches.messages import DecodedSlice, RowOutcome, RowRequest
from relay_batches.router.aliases import AliasTable, Deployment
from relay_batches.router.http1 import (
    BadReply,
    Http1Client,
    ServerDisconnected,
    UpstreamConnectionError,
)
from relay_batches.router.router import MAX_REPLY_BYTES, ModelRouter
from relay_batches.services.row_worker.core import RowRunner
from tests.helpers.raw_upstream import Handler, on_both_loops, read_request, serving

LIMIT = 1000
LATE_S = 0.03  # how long after the real reply the hostile upstream sends its copy


def replied(body: bytes) -> bytes:
    """A complete reply carrying ``body``, framed by its length."""
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def late_copies(answer: Callable[[bytes], bytes] = lambda body: body) -> Handler:
    """An upstream answering each request with ``answer(its body)``, then sending the same
    reply again 30 ms later (before it reads the next request): a reply nobody asked for,
    waiting for whatever is sent next."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                request = await read_request(reader)
                reply = replied(answer(request.partition(b"\r\n\r\n")[2]))
                writer.write(reply)
                await asyncio.sleep(LATE_S)
                writer.write(reply)
                await writer.drain()
        writer.close()

    return handle


def test_a_late_reply_never_reaches_another_workspace() -> None:
    async def scenario() -> None:
        async with serving(late_copies()) as served, Http1Client() as client:
            foreign: list[tuple[str, bytes]] = []
            answered = 0

            pause = random.Random(7)

            async def caller(workspace: str, worker: int) -> None:
                nonlocal answered
                for i in range(6):
                    # Callers pause between calls, as a worker's rows do: a connection one
                    # released is taken by whichever call comes next, of either workspace.
                    await asyncio.sleep(pause.uniform(0, 0.01))
                    body = f"{workspace}:{worker}:{i}".encode()
                    try:
                        reply = await client.post(
                            served.url, {}, body, 5, LIMIT, workspace=workspace
                        )
                    except UpstreamConnectionError:
                        continue  # a connection the client dropped: never a wrong reply
                    answered += 1
                    if not reply.body.startswith(f"{workspace}:".encode()):
                        foreign.append((workspace, reply.body))

            await asyncio.gather(
                *(caller(workspace, n) for workspace in ("ws-a", "ws-b") for n in range(8))
            )
            assert foreign == []  # 0 wrong of 96
            assert answered > 48

    on_both_loops(scenario)


def chat_reply(content: str) -> bytes:
    """A chat-completions reply whose content is ``content``."""
    return orjson.dumps(
        {
            "choices": [{"message": {"content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        }
    )


def echoed_row(body: bytes) -> bytes:
    """A chat reply whose content is the text of the request's last message."""
    return chat_reply(orjson.loads(body)["messages"][-1]["content"])


def test_rows_of_two_workspaces_never_get_each_others_replies() -> None:
    # Two jobs of two workspaces run together by one worker on the same origin: the
    # workspace goes from each slice through the router to the connection pool.
    async def scenario() -> None:
        async with serving(late_copies(echoed_row)) as served, Http1Client() as client:
            upstream = Deployment(
                name="d", provider="openai", base_url=served.url, model="m", timeout_s=5.0
            )
            router = ModelRouter(AliasTable({"m": (upstream,)}), client)
            outcomes: list[RowOutcome] = []

            async def sink(outcome: RowOutcome) -> None:
                outcomes.append(outcome)

            runner = RowRunner(router, sink, concurrency=32)
            jobs = {"job-a": "ws-a", "job-b": "ws-b"}
            await asyncio.gather(
                *(
                    runner.handle_slice(
                        DecodedSlice(
                            job,
                            "m",
                            tuple(
                                (i, RowRequest([{"role": "user", "content": f"{job} row {i}"}]))
                                for i in range(60)
                            ),
                            workspace=workspace,
                        )
                    )
                    for job, workspace in jobs.items()
                )
            )
            assert len(outcomes) == 120
            answered = [o for o in outcomes if o.content is not None]
            crossed = [o for o in answered if not o.content.startswith(f"{o.batch_id} row ")]
            assert crossed == []  # 0 wrong of 120
            assert len(answered) > 60

    uvloop.run(scenario())


def test_bytes_on_an_idle_connection_close_it() -> None:
    async def scenario() -> None:
        async def unsolicited(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            number = served.connections
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await read_request(reader)
                writer.write(replied(b"answer on %d" % number))
                if number == 1:
                    await asyncio.sleep(LATE_S)
                    writer.write(replied(b"SMUGGLED"))  # nobody asked
                while True:
                    await read_request(reader)
                    writer.write(replied(b"again on %d" % number))
            writer.close()

        async with serving(unsolicited) as served, Http1Client() as client:
            assert (await client.post(served.url, {}, b"{}", 5, LIMIT)).body == b"answer on 1"
            await asyncio.sleep(LATE_S * 4)  # the unsolicited reply reaches the idle connection
            assert client.idle_connections() == 0
            assert (await client.post(served.url, {}, b"{}", 5, LIMIT)).body == b"answer on 2"
            # Caught sending what nobody asked for: no reuse of its connections for a while.
            assert (await client.post(served.url, {}, b"{}", 5, LIMIT)).body == b"answer on 3"
            assert served.connections == 3

    on_both_loops(scenario)


def reset(writer: asyncio.StreamWriter) -> None:
    """Drop the connection with a TCP reset (not a clean close)."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def test_a_reset_inside_a_reply_framed_by_the_close_is_a_disconnect() -> None:
    # Framed by the connection's end, the body is complete only at a clean close: a reset
    # is a connection failure (which the router retries), not a truncated success.
    async def scenario() -> None:
        async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + b'{"choices": [{"message"')
            await writer.drain()
            await asyncio.sleep(0.05)  # the client has read the head and part of the body
            reset(writer)

        async def whole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\n\r\nall of it")
            await writer.drain()
            writer.close()

        async with Http1Client() as client:
            async with serving(cut) as served:
                with pytest.raises(ServerDisconnected):
                    await client.post(served.url, {}, b"{}", 5, LIMIT)
            async with serving(whole) as served:
                assert (await client.post(served.url, {}, b"{}", 5, LIMIT)).body == b"all of it"
            assert client.idle_connections() == 0

    on_both_loops(scenario)


def test_a_million_one_byte_chunks_cost_bounded_cpu() -> None:
    async def scenario() -> None:
        async def tiny_chunks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            writer.write(head + b"1\r\nx\r\n" * 1_000_000 + b"0\r\n\r\n")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()

        gaps: list[float] = []

        async def ticker() -> None:
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        async with serving(tiny_chunks) as served, Http1Client() as client:
            ticking = asyncio.create_task(ticker())
            cpu = time.process_time()
            with pytest.raises(BadReply):
                await client.post(served.url, {}, b"{}", 30, MAX_REPLY_BYTES)
            cpu = time.process_time() - cpu
            ticking.cancel()
            # Today's parser took 2.4 s of CPU for this reply and held the loop for seconds.
            assert cpu < 0.5
            assert max(gaps, default=0.0) < 0.25

    uvloop.run(scenario())


def test_a_bare_cr_inside_a_header_value_is_refused() -> None:
    async def scenario() -> None:
        async def bare_cr(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nX-Note: a\rb\r\nContent-Length: 2\r\n\r\nok")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
                await reader.read()
            writer.close()

        async with serving(bare_cr) as served, Http1Client() as client:
            with pytest.raises(BadReply):
                await client.post(served.url, {}, b"{}", 5, LIMIT)
            assert client.idle_connections() == 0

    on_both_loops(scenario)


def test_a_reply_framed_two_ways_is_read_as_chunked_and_its_connection_not_reused() -> None:
    async def scenario() -> None:
        async def two_ways(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    await read_request(reader)
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n"
                        b"\r\n2\r\nok\r\n0\r\n\r\n" + replied(b"SMUGGLED")
                    )
            writer.close()

        async with serving(two_ways) as served, Http1Client() as client:
            for _ in range(3):
                assert (await client.post(served.url, {}, b"{}", 5, LIMIT)).body == b"ok"
                assert client.idle_connections() == 0
            assert served.connections == 3

    on_both_loops(scenario)


def test_an_upstream_caught_sending_unasked_replies_gets_no_more_reuse() -> None:
    # Within one workspace a reply held back until the next request is on the wire cannot
    # be told from its answer; once caught, the workspace's calls to that upstream each
    # get a connection of their own, so it has no next request to answer any more.
    async def scenario() -> None:
        async with serving(late_copies()) as served, Http1Client() as client:
            assert (await client.post(served.url, {}, b"1", 5, LIMIT, "ws-a")).body == b"1"
            await client.post(served.url, {}, b"2", 5, LIMIT, "ws-a")  # reuses: the late "1"
            await asyncio.sleep(LATE_S * 3)  # its own reply arrives after: caught
            assert client.idle_connections() == 0
            for n in range(3, 8):
                body = str(n).encode()
                assert (await client.post(served.url, {}, body, 5, LIMIT, "ws-a")).body == body
                assert client.idle_connections() == 0
            assert served.connections == 6
            # Another workspace's pool to the same origin is not affected.
            await client.post(served.url, {}, b"b", 5, LIMIT, "ws-b")
            assert client.idle_connections() == 1

    on_both_loops(scenario)
