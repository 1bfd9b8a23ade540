"""The upstream HTTP/1.1 client: reply framing fed byte by byte, and calls against local
servers (aiohttp's, and raw sockets that misbehave) on the default loop and on uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import shutil
import ssl
import subprocess
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from relay_batches.router.http1 import Http1Client
from relay_batches.router.http_reply import (
    MAX_HEAD_BYTES,
    BadReply,
    ConnectFailed,
    ReplyReader,
    ServerDisconnected,
    encode_head,
)
from tests.helpers.raw_upstream import on_both_loops, raw_server, read_request, serving

LIMIT = 1000


def feed_bytewise(reader: ReplyReader, data: bytes) -> bool:
    done = False
    for i in range(len(data)):
        done = reader.feed(data[i : i + 1])
    return done


def test_content_length_fed_a_byte_at_a_time() -> None:
    reader = ReplyReader(LIMIT)
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nRetry-After: 3\r\n\r\nhello"
    assert feed_bytewise(reader, wire)
    assert reader.reply is not None
    assert (reader.reply.status, reader.reply.body) == (200, b"hello")
    assert reader.reply.headers["retry-after"] == "3"
    assert reader.reusable


def test_chunked_with_extensions_and_trailers() -> None:
    reader = ReplyReader(LIMIT)
    wire = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    assert feed_bytewise(reader, wire)
    assert reader.reply is not None and reader.reply.body == b"hello world"
    assert reader.reusable


def test_interim_replies_are_skipped() -> None:
    reader = ReplyReader(LIMIT)
    wire = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"
    assert reader.feed(wire)
    assert reader.reply is not None and (reader.reply.status, reader.reply.body) == (201, b"ok")


def test_no_body_statuses_and_zero_length() -> None:
    for wire in (
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    ):
        reader = ReplyReader(LIMIT)
        assert reader.feed(wire)
        assert reader.reply is not None and reader.reply.body == b"" and reader.reusable


def test_read_until_close_is_never_reused() -> None:
    reader = ReplyReader(LIMIT)
    assert not reader.feed(b"HTTP/1.1 200 OK\r\n\r\npart one, ")
    assert not reader.feed(b"part two")
    assert reader.eof()
    assert reader.reply is not None and reader.reply.body == b"part one, part two"
    assert not reader.reusable


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n2\r\n",
    ],
)
def test_replies_that_forbid_reuse(head: bytes) -> None:
    reader = ReplyReader(LIMIT)
    wire = head + (b"ok\r\n0\r\n\r\n" if b"chunked" in head else b"ok")
    assert reader.feed(wire)
    assert reader.reply is not None and reader.reply.body == b"ok"
    assert not reader.reusable


def test_http10_keep_alive_is_reused() -> None:
    reader = ReplyReader(LIMIT)
    assert reader.feed(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok")
    assert reader.reusable


def test_bytes_beyond_the_reply_forbid_reuse() -> None:
    reader = ReplyReader(LIMIT)
    assert reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
    assert reader.reply is not None and reader.reply.body == b"ok"
    assert not reader.reusable


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000,
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1388\r\n" + b"x" * 5000,
        b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 5000,
    ],
)
def test_a_body_over_the_limit_stops_at_limit_plus_one(wire: bytes) -> None:
    reader = ReplyReader(LIMIT)
    assert reader.feed(wire)
    assert reader.reply is not None and len(reader.reply.body) == LIMIT + 1
    assert not reader.reusable


def test_gzip_is_inflated_and_a_bomb_is_cut_at_the_limit() -> None:
    small = gzip.compress(b"hello")
    reader = ReplyReader(LIMIT)
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(small)}\r\n\r\n"
    assert reader.feed(head.encode() + small)
    assert reader.reply is not None and reader.reply.body == b"hello"
    bomb = gzip.compress(b"\0" * 10_000_000)
    reader = ReplyReader(LIMIT)
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n\r\n"
    assert reader.feed(head.encode() + bomb)
    assert reader.reply is not None and len(reader.reply.body) == LIMIT + 1


def test_a_coded_body_cut_at_the_cap_stays_over_the_limit() -> None:
    coded = gzip.compress(os.urandom(4000))  # incompressible: over the cap coded too
    assert len(coded) > LIMIT + 1
    reader = ReplyReader(LIMIT)
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(coded)}\r\n\r\n"
    assert reader.feed(head.encode() + coded)
    assert reader.reply is not None and len(reader.reply.body) == LIMIT + 1


def test_a_repeated_connection_field_is_read_whole() -> None:
    reader = ReplyReader(LIMIT)
    wire = b"HTTP/1.1 200 OK\r\nConnection: close\r\nConnection: keep-alive\r\n"
    assert reader.feed(wire + b"Content-Length: 0\r\n\r\n")
    assert not reader.reusable


def test_raw_deflate_is_inflated() -> None:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    raw = compressor.compress(b"hello") + compressor.flush()
    reader = ReplyReader(LIMIT)
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: {len(raw)}\r\n\r\n"
    assert reader.feed(head.encode() + raw)
    assert reader.reply is not None and reader.reply.body == b"hello"


@pytest.mark.parametrize(
    "wire",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\nok",
        "HTTP/1.1 200 OK\r\nContent-Length: \u00b2\r\n\r\n".encode("latin-1"),
        b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        b"HTTP/1.1 099 Odd\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n" * 17,
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 10\r\n\r\n"
        + gzip.compress(b"hello world")[:10],
    ],
)
def test_malformed_replies_are_bad_replies(wire: bytes) -> None:
    with pytest.raises(BadReply):
        ReplyReader(LIMIT).feed(wire)


def test_a_head_without_end_is_bounded() -> None:
    reader = ReplyReader(LIMIT)
    with pytest.raises(BadReply):
        reader.feed(b"HTTP/1.1 200 OK\r\nX: " + b"a" * (MAX_HEAD_BYTES + 10))


def test_eof_before_the_end_is_a_disconnect() -> None:
    reader = ReplyReader(LIMIT)
    assert not reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    with pytest.raises(ServerDisconnected):
        reader.eof()


def test_the_request_head_refuses_injection_and_frames_itself() -> None:
    head = encode_head(b"/v1/x", b"h:8080", {"Authorization": "Bearer k", "Host": "evil"}, 7)
    assert head == (
        b"POST /v1/x HTTP/1.1\r\nHost: h:8080\r\nContent-Length: 7\r\n"
        b"Authorization: Bearer k\r\nUser-Agent: relay-batches\r\n\r\n"
    )
    with pytest.raises(ValueError):
        encode_head(b"/", b"h", {"X": "a\r\nEvil: 1"}, 0)
    with pytest.raises(ValueError):
        encode_head(b"/", b"h", {"X\n": "a"}, 0)


# --- calls against servers, on both loops ------------------------------------------------


@contextlib.asynccontextmanager
async def served(
    app: web.Application, tls: ssl.SSLContext | None = None
) -> AsyncIterator[TestServer]:
    """``app`` served on a local port for the block (over TLS with ``tls``)."""
    server = TestServer(app, host="127.0.0.1")
    await server.start_server(ssl=tls)  # this aiohttp takes ssl here, not in TestServer()
    assert server.scheme == ("https" if tls else "http")
    try:
        yield server
    finally:
        await server.close()


def peer_of(request: web.Request) -> object:
    """The client address a request came from (one per connection)."""
    return request.transport.get_extra_info("peername") if request.transport else None


def hanging_app(gate: asyncio.Event) -> web.Application:
    """An app that sets ``gate`` on a request and answers it only after 5 s."""

    async def hang(request: web.Request) -> web.Response:
        gate.set()
        await asyncio.sleep(5)
        return web.Response(text="late")

    app = web.Application()
    app.router.add_post("/", hang)
    return app


def test_keep_alive_reuses_one_connection_and_reads_chunked_replies() -> None:
    async def scenario() -> None:
        peers: list[object] = []

        async def echo(request: web.Request) -> web.StreamResponse:
            peers.append(peer_of(request))
            body = await request.read()
            if request.query.get("chunked"):
                response = web.StreamResponse()
                response.enable_chunked_encoding()
                await response.prepare(request)
                await response.write(b"got ")
                await response.write(body)
                await response.write_eof()
                return response
            return web.Response(body=b"got " + body, headers={"Retry-After": "2"})

        app = web.Application()
        app.router.add_post("/echo", echo)
        async with served(app) as server:
            async with Http1Client() as client:
                url = str(server.make_url("/echo"))
                first = await client.post(url, {"A": "1"}, b"one", 5, LIMIT)
                second = await client.post(url + "?chunked=1", {}, b"two", 5, LIMIT)
                assert (first.status, first.body, first.headers["retry-after"]) == (
                    200,
                    b"got one",
                    "2",
                )
                assert (second.status, second.body) == (200, b"got two")
                assert peers[0] == peers[1]  # the same connection
                assert client.idle_connections() == 1

    on_both_loops(scenario)


def test_a_large_body_goes_out_whole() -> None:
    async def scenario() -> None:
        async def size(request: web.Request) -> web.Response:
            return web.Response(text=str(len(await request.read())))

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/size", size)
        async with served(app) as server:
            async with Http1Client() as client:
                body = b"x" * (20 * 1024 * 1024)
                reply = await client.post(str(server.make_url("/size")), {}, body, 30, LIMIT)
                assert reply.body == str(len(body)).encode()

    on_both_loops(scenario)


def test_a_timeout_aborts_the_connection_and_the_next_call_works() -> None:
    async def scenario() -> None:
        async def slow(request: web.Request) -> web.Response:
            if request.query.get("slow"):
                await asyncio.sleep(5)
            return web.Response(text="fast")

        app = web.Application()
        app.router.add_post("/", slow)
        async with served(app) as server:
            async with Http1Client() as client:
                url = str(server.make_url("/"))
                with pytest.raises(TimeoutError):
                    await client.post(url + "?slow=1", {}, b"", 0.2, LIMIT)
                assert client.idle_connections() == 0
                assert (await client.post(url, {}, b"", 5, LIMIT)).body == b"fast"

    on_both_loops(scenario)


def test_a_cancelled_call_aborts_its_connection() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        async with served(hanging_app(gate)) as server:
            async with Http1Client() as client:
                call = asyncio.create_task(
                    client.post(str(server.make_url("/")), {}, b"", 10, LIMIT)
                )
                await gate.wait()
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
                assert client.idle_connections() == 0

    on_both_loops(scenario)


def test_misbehaving_servers() -> None:
    async def scenario() -> None:
        async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"nonsense\r\n\r\n")
            await writer.drain()
            await reader.read()  # until the client drops the connection
            writer.close()
            await writer.wait_closed()

        async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
            await writer.drain()
            writer.close()
            await writer.wait_closed()

        async with Http1Client() as client:
            for handler, error in ((garbage, BadReply), (cut, ServerDisconnected)):
                server, url = await raw_server(handler)
                try:
                    with pytest.raises(error):
                        await client.post(url, {}, b"{}", 5, LIMIT)
                    assert client.idle_connections() == 0
                finally:
                    server.close()
                    await server.wait_closed()
            with pytest.raises(ConnectFailed):
                await client.post(url, {}, b"{}", 5, LIMIT)  # that server is gone now

    on_both_loops(scenario)


def test_a_pooled_connection_the_server_closed_is_not_used() -> None:
    async def scenario() -> None:
        connections = 0

        async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()  # keep-alive promised, then closed: an idle timeout upstream

        server, url = await raw_server(once)
        try:
            async with Http1Client() as client:
                assert (await client.post(url, {}, b"{}", 5, LIMIT)).body == b"ok"
                await asyncio.sleep(0.1)  # the close reaches the client
                assert client.idle_connections() == 0
                assert (await client.post(url, {}, b"{}", 5, LIMIT)).body == b"ok"
                assert connections == 2
        finally:
            server.close()
            await server.wait_closed()

    on_both_loops(scenario)


def test_closing_the_client_fails_calls_in_flight_as_disconnects() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        async with served(hanging_app(gate)) as server:
            client = Http1Client()
            call = asyncio.create_task(client.post(str(server.make_url("/")), {}, b"", 10, LIMIT))
            await gate.wait()
            await client.close()
            with pytest.raises(ServerDisconnected):
                await call

    on_both_loops(scenario)


def test_a_pooled_connection_dropped_as_the_request_goes_out_is_not_sent_again() -> None:
    # The server may have taken the request up: the client never sends it twice (the
    # router retries, with its backoff, limiter and attempt count); the next call works.
    async def scenario() -> None:
        connections = 0

        async def first_reply_then_drop(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            nonlocal connections
            connections += 1
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            if connections == 1:
                await read_request(reader)  # the second request: dropped without a byte
            else:
                await reader.read()
            writer.close()
            await writer.wait_closed()

        server, url = await raw_server(first_reply_then_drop)
        try:
            async with Http1Client() as client:
                assert (await client.post(url, {}, b"{}", 5, LIMIT)).body == b"ok"
                with pytest.raises(ServerDisconnected):
                    await client.post(url, {}, b"{}", 5, LIMIT)
                assert connections == 1
                assert (await client.post(url, {}, b"{}", 5, LIMIT)).body == b"ok"
                assert connections == 2
            await asyncio.sleep(0.1)  # the second handler sees the close and ends
        finally:
            server.close()
            await server.wait_closed()

    on_both_loops(scenario)


# --- https, against a server with a self-signed certificate -------------------------------


def self_signed(directory: Path, sans: list[str]) -> tuple[Path, Path]:
    """A self-signed certificate and its key, naming ``sans`` ("IP:..." or "DNS:...")."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    assert shutil.which("openssl") is not None, "the https tests need the openssl tool"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=relay-batches test",
            "-addext",
            "subjectAltName=" + ",".join(sans),
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def echo_app(peers: list[object]) -> web.Application:
    """An app answering a POST with the body it received, recording its peers."""

    async def echo(request: web.Request) -> web.Response:
        peers.append(peer_of(request))
        return web.Response(body=await request.read())

    app = web.Application()
    app.router.add_post("/echo", echo)
    return app


def test_https_with_a_trusted_certificate_reuses_one_connection(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, ["IP:127.0.0.1", "DNS:localhost"])

    async def scenario() -> None:
        peers: list[object] = []
        async with served(echo_app(peers), server_context(cert, key)) as server:
            trusting = ssl.create_default_context(cafile=str(cert))
            async with Http1Client(ssl_context=trusting) as client:
                url = f"https://127.0.0.1:{server.port}/echo"
                first = await client.post(url, {"A": "1"}, b"one", 5, LIMIT)
                second = await client.post(url + "?again=1", {}, b"second body", 5, LIMIT)
                assert (first.status, first.body) == (200, b"one")
                assert (second.status, second.body) == (200, b"second body")
                assert len(peers) == 2 and peers[0] == peers[1]  # the same connection
                assert client.idle_connections() == 1

    on_both_loops(scenario)


def test_https_refuses_an_untrusted_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, ["IP:127.0.0.1", "DNS:localhost"])

    async def scenario() -> None:
        peers: list[object] = []
        async with served(echo_app(peers), server_context(cert, key)) as server:
            async with Http1Client() as client:  # the default context: system CAs only
                with pytest.raises(ConnectFailed) as failed:
                    await client.post(f"https://127.0.0.1:{server.port}/echo", {}, b"x", 5, LIMIT)
                cause = failed.value.__cause__
                assert isinstance(cause, ssl.SSLCertVerificationError)
                assert cause.verify_code == 18  # X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT
                assert client.idle_connections() == 0
            assert peers == []

    on_both_loops(scenario)


def test_https_refuses_a_certificate_for_another_host(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, ["DNS:localhost"])  # names localhost, not 127.0.0.1

    async def scenario() -> None:
        peers: list[object] = []
        async with served(echo_app(peers), server_context(cert, key)) as server:
            trusting = ssl.create_default_context(cafile=str(cert))
            async with Http1Client(ssl_context=trusting) as client:
                with pytest.raises(ConnectFailed) as failed:
                    await client.post(f"https://127.0.0.1:{server.port}/echo", {}, b"x", 5, LIMIT)
                cause = failed.value.__cause__
                assert isinstance(cause, ssl.SSLCertVerificationError)
                assert cause.verify_code == 64  # X509_V_ERR_IP_ADDRESS_MISMATCH
                assert "mismatch" in str(failed.value)
                assert client.idle_connections() == 0
            assert peers == []

    on_both_loops(scenario)


def test_an_idle_connection_past_keepalive_is_not_reused() -> None:
    async def scenario() -> None:
        peers: list[object] = []

        async def peer(request: web.Request) -> web.Response:
            peers.append(peer_of(request))
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/", peer)
        async with served(app) as server:
            async with Http1Client(keepalive_s=0.05) as client:
                url = str(server.make_url("/"))
                await client.post(url, {}, b"", 5, LIMIT)
                await asyncio.sleep(0.1)
                await client.post(url, {}, b"", 5, LIMIT)
                assert peers[0] != peers[1]

    on_both_loops(scenario)


def test_workspaces_use_connections_of_their_own() -> None:
    async def scenario() -> None:
        peers: list[object] = []
        async with served(echo_app(peers)) as server, Http1Client() as client:
            url = str(server.make_url("/echo"))
            for workspace in ("ws-a", "ws-b", "ws-a", "ws-b"):
                reply = await client.post(url, {}, workspace.encode(), 5, LIMIT, workspace)
                assert reply.body == workspace.encode()
            assert peers[0] == peers[2] and peers[1] == peers[3]  # each its own, reused
            assert peers[0] != peers[1]
            assert (client.pools(), client.idle_connections()) == (2, 2)

    on_both_loops(scenario)


def test_idle_connections_are_closed_after_keepalive_and_their_pools_dropped() -> None:
    async def scenario() -> None:
        closed = asyncio.Event()

        async def one_connection(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await reader.read()  # until the client closes the idle connection
            closed.set()
            writer.close()

        async with serving(one_connection) as served, Http1Client(keepalive_s=0.05) as client:
            assert (await client.post(served.url, {}, b"{}", 5, LIMIT, "ws-a")).body == b"ok"
            assert (client.pools(), client.idle_connections()) == (1, 1)
            await asyncio.wait_for(closed.wait(), 5)  # closed by the client, unused
            assert (client.pools(), client.idle_connections()) == (0, 0)

    on_both_loops(scenario)


def test_idle_connections_are_bounded_across_workspaces() -> None:
    # However many workspaces a worker serves, at most max_idle connections wait (the
    # oldest closed first) and a pool lives only while it holds a connection.
    async def scenario() -> None:
        peers: list[object] = []
        async with served(echo_app(peers)) as server, Http1Client(max_idle=3) as client:
            url = str(server.make_url("/echo"))
            for n in range(10):
                await client.post(url, {}, b"x", 5, LIMIT, f"ws-{n}")
                assert client.idle_connections() == min(n + 1, 3)
            await asyncio.sleep(0.05)  # the closed connections' ends are seen
            assert (client.pools(), client.idle_connections()) == (3, 3)
            await client.post(url, {}, b"x", 5, LIMIT, "ws-9")  # the newest is kept
            assert peers[-1] == peers[9] and len(set(peers)) == 10

    on_both_loops(scenario)
