"""Unit tests of the offload clients' pure parts: custom ids, input lines built as the
realtime calls would be, result lines of both providers, and line splitting of a
streamed body."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from relay_batches.dialects.anthropic import batch_api as anthropic_batch
from relay_batches.dialects.openai import batch_api as openai_batch
from relay_batches.ledger.offload import BatchState, OffloadLine, RowState
from relay_batches.offload.lines import (
    MAX_JSON_BYTES,
    MAX_LINE_BYTES,
    ProviderError,
    ProviderState,
    ResultLine,
    custom_id,
    json_lines,
    parse_custom_id,
    request_json,
)
from relay_batches.router.aliases import BatchOptions, Deployment
from relay_batches.router.types import Completion, UnsupportedRequest
from relay_batches.services.offloader.core import MAX_REFUSALS, gives_up
from relay_batches.services.offloader.inputs import build_input

JOB = "0123456789abcdef0123456789abcdef"
NO_SESSION: Any = None  # building lines makes no call
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def batch_deployment(provider: str, **params: Any) -> Deployment:
    wire = provider.removesuffix("-batch")
    return Deployment(
        name=f"{wire}-b",
        provider=provider,
        base_url="http://127.0.0.1:9/v1",
        model=f"{wire}-model",
        api_key="k",
        params=params,
        batch=BatchOptions(wire, 100, 10_000),
    )


def test_a_custom_id_round_trips_and_fits_anthropics_pattern() -> None:
    value = custom_id(12345, JOB, 99_999)
    assert value == f"12345-{JOB}-99999"
    assert len(value) <= 64 and all(c.isalnum() or c in "_-" for c in value)
    assert parse_custom_id(value, 12345) == (JOB, 99_999)


@pytest.mark.parametrize(
    "value",
    [None, 7, "", f"12-{JOB}-1", f"12345-{JOB}", f"12345-{JOB.upper()}-1", f"12345-{JOB}-x"],
)
def test_a_foreign_custom_id_is_refused(value: object) -> None:
    assert parse_custom_id(value, 12345) is None


def test_an_openai_line_carries_the_realtime_body() -> None:
    client = openai_batch.OpenAIBatches(
        batch_deployment("openai-batch", temperature=0.1), NO_SESSION
    )
    line = orjson.loads(client.line(3, JOB, 7, MESSAGES, {"max_tokens": 5}))
    assert line == {
        "custom_id": f"3-{JOB}-7",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "temperature": 0.1,
            "max_tokens": 5,
            "model": "openai-model",
            "messages": MESSAGES,
        },
    }
    assert client.frame() == (b"", b"\n", b"\n")


def test_an_anthropic_request_carries_the_translated_body() -> None:
    client = anthropic_batch.AnthropicBatches(batch_deployment("anthropic-batch"), NO_SESSION)
    line = orjson.loads(client.line(3, JOB, 7, MESSAGES, {"max_tokens": 5}))
    assert line == {
        "custom_id": f"3-{JOB}-7",
        "params": {
            "model": "anthropic-model",
            "max_tokens": 5,
            "system": "be brief",
            "messages": [{"role": "user", "content": "hi"}],
        },
    }
    with pytest.raises(UnsupportedRequest, match="seed"):
        client.line(3, JOB, 7, MESSAGES, {"seed": 1})
    opening, separator, closing = client.frame()
    assert orjson.loads(opening + b"1" + separator + b"2" + closing) == {"requests": [1, 2]}


def openai_output(index: int, status: int = 200) -> bytes:
    body = {
        "choices": [{"message": {"content": f"answer {index}"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4},
        "model": "gpt-x",
    }
    line = {
        "id": f"req_{index}",
        "custom_id": f"5-{JOB}-{index}",
        "response": {"status_code": status, "request_id": "r", "body": body},
        "error": None,
    }
    return orjson.dumps(line)


def test_openai_result_lines() -> None:
    ok = openai_batch.result_line(openai_output(2), 5)
    assert ok == ResultLine(JOB, 2, ok.reply if ok else None)
    assert ok is not None and ok.reply is not None
    assert ok.reply.completion == Completion("answer 2", 3, 4, None, "stop", "gpt-x")
    assert openai_batch.result_line(openai_output(2, 500), 5) == ResultLine(JOB, 2, None)
    expired = {"custom_id": f"5-{JOB}-4", "response": None, "error": {"code": "batch_expired"}}
    assert openai_batch.result_line(orjson.dumps(expired), 5) == ResultLine(JOB, 4, None)
    assert openai_batch.result_line(openai_output(2), 6) is None, "another record's line"
    assert openai_batch.result_line(b"not json", 5) is None


def test_anthropic_result_lines() -> None:
    message = {
        "content": [{"type": "text", "text": "hello"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 2, "output_tokens": 1},
        "model": "claude-x",
    }
    ok = {"custom_id": f"5-{JOB}-1", "result": {"type": "succeeded", "message": message}}
    parsed = anthropic_batch.result_line(orjson.dumps(ok), 5)
    assert parsed is not None and parsed.reply is not None
    assert parsed.reply.completion == Completion("hello", 2, 1, None, "stop", "claude-x")
    for kind in ("errored", "expired", "canceled"):
        line = {"custom_id": f"5-{JOB}-1", "result": {"type": kind}}
        assert anthropic_batch.result_line(orjson.dumps(line), 5) == ResultLine(JOB, 1, None)


async def test_json_lines_splits_a_stream_across_chunks_and_skips_an_oversized_line() -> None:
    big = b"x" * (MAX_LINE_BYTES + 10)
    body = b'{"a":1}\n\n{"b":"' + b"2" * 70_000 + b'"}\n' + big + b"\n" + b'{"c":3}'

    server = await chunked_server(body, -(-len(body) // 40_000), 0)
    try:
        async with aiohttp.ClientSession() as session, session.get(server.make_url("/")) as r:
            lines = [line async for line in json_lines(r)]
    finally:
        await server.close()
    assert [orjson.loads(line) for line in lines] == [{"a": 1}, {"b": "2" * 70_000}, {"c": 3}]


@pytest.mark.parametrize(
    ("state", "message", "permanent", "gives"),
    [
        ("recorded", "create: HTTP 400: bad input", True, True),
        ("creating", "create: HTTP 400: bad input", True, True),
        ("ended", "results: HTTP 404: gone", True, True),
        ("submitted", "retrieve: HTTP 404: no such batch", True, True),
        ("submitted", "retrieve: HTTP 401: bad key", True, False),
        ("recorded", "upload: ClientConnectorError", False, False),
        ("submitted", "retrieve: HTTP 503: busy", False, False),
    ],
)
def test_which_failures_end_a_provider_batch(
    state: str, message: str, permanent: bool, gives: bool
) -> None:
    assert gives_up(BatchState(state), ProviderError(message, permanent)) is gives


@pytest.mark.parametrize(
    ("state", "permanent", "refusals", "past_window", "gives"),
    [
        ("submitted", True, MAX_REFUSALS - 1, False, False),
        ("submitted", True, MAX_REFUSALS, False, True),
        ("canceling", True, MAX_REFUSALS, False, True),
        ("submitted", True, 1, True, True),
        # Past its window a batch ends whatever the failure: a provider that only ever
        # answers 5xx or times out does not hold its rows for good.
        ("submitted", False, 1, True, True),
        ("submitted", False, MAX_REFUSALS, False, False),
    ],
)
def test_a_held_batch_refused_for_good_ends_after_a_bound_or_its_window(
    state: str, permanent: bool, refusals: int, past_window: bool, gives: bool
) -> None:
    exc = ProviderError("retrieve: HTTP 403: forbidden", permanent)
    assert gives_up(BatchState(state), exc, refusals, past_window) is gives


class PagedLines:
    """The store's side of building an input: rows two at a time, the refused recorded."""

    def __init__(self, lines: list[OffloadLine], page: int = 2) -> None:
        self._lines = lines
        self.page = page
        self.marked: list[tuple[list[tuple[str, int]], RowState]] = []

    async def lines(
        self, offload_id: int, after: tuple[str, int] | None, limit: int, max_bytes: int
    ) -> list[OffloadLine]:
        rest = [x for x in self._lines if after is None or (x.batch_id, x.row_index) > after]
        return rest[: self.page]

    async def mark_rows(self, keys: list[tuple[str, int]], state: RowState) -> int:
        if keys:
            self.marked.append((keys, state))
        return len(keys)


@pytest.mark.parametrize("refused", [set(), {0, 1}, {1, 3}, {0, 1, 2, 3, 4}])
async def test_an_anthropic_input_is_one_json_body_whatever_rows_it_refuses(
    tmp_path: Path, refused: set[int]
) -> None:
    client = anthropic_batch.AnthropicBatches(batch_deployment("anthropic-batch"), NO_SESSION)
    rows = [
        OffloadLine(
            JOB, i, orjson.dumps(MESSAGES).decode(), '{"seed": 1}' if i in refused else "{}"
        )
        for i in range(5)
    ]
    store = PagedLines(rows)
    built = await build_input(store, client, 9, str(tmp_path))  # type: ignore[arg-type]
    data = await asyncio.to_thread(Path(built.path).read_bytes)
    assert built.size == len(data) and built.rows == 5 - len(refused)
    sent = [r["custom_id"] for r in orjson.loads(data)["requests"]]
    assert sent == [f"9-{JOB}-{i}" for i in range(5) if i not in refused]
    assert [k for keys, _ in store.marked for k in keys] == [(JOB, i) for i in sorted(refused)]


async def test_an_openai_input_is_one_line_per_row(tmp_path: Path) -> None:
    client = openai_batch.OpenAIBatches(batch_deployment("openai-batch"), NO_SESSION)
    rows = [OffloadLine(JOB, i, orjson.dumps(MESSAGES).decode(), "{}") for i in range(3)]
    built = await build_input(PagedLines(rows), client, 9, str(tmp_path))  # type: ignore[arg-type]
    lines = (await asyncio.to_thread(Path(built.path).read_bytes)).splitlines()
    assert [orjson.loads(line)["custom_id"] for line in lines] == [f"9-{JOB}-{i}" for i in range(3)]


async def test_a_page_of_an_input_is_grouped_by_request_prefix_when_asked(
    tmp_path: Path,
) -> None:
    client = openai_batch.OpenAIBatches(batch_deployment("openai-batch"), NO_SESSION)

    def asking(i: int) -> str:
        system = {"role": "system", "content": f"shared prompt {'BA'[i % 2]}"}
        return orjson.dumps([system, {"role": "user", "content": f"q{i}"}]).decode()

    rows = [OffloadLine(JOB, i, asking(i), "{}") for i in range(8)]
    orders = []
    for group in (False, True):
        paged = PagedLines(rows, page=4)
        built = await build_input(paged, client, 9, str(tmp_path), group)  # type: ignore[arg-type]
        lines = (await asyncio.to_thread(Path(built.path).read_bytes)).splitlines()
        orders.append([int(orjson.loads(line)["custom_id"].rsplit("-", 1)[1]) for line in lines])
    # grouped within each page (of four rows here), each group where its first row was,
    # never across pages
    assert orders == [[0, 1, 2, 3, 4, 5, 6, 7], [0, 2, 1, 3, 4, 6, 5, 7]]


async def chunked_server(body: bytes, pieces: int, pause_s: float = 0.05) -> TestServer:
    """A server answering every GET with ``body`` in ``pieces`` writes, ``pause_s``
    between each (no content length), so a client sees only part of it buffered at
    first."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        step = -(-len(body) // pieces)
        for at in range(0, len(body), step):
            await response.write(body[at : at + step])
            await asyncio.sleep(pause_s)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    server = TestServer(app)
    await server.start_server()
    return server


async def test_a_json_reply_in_several_chunks_is_read_to_its_end() -> None:
    listing = {"data": [{"id": f"batch_{i}", "metadata": {"n": "x" * 500}} for i in range(300)]}
    body = orjson.dumps({**listing, "has_more": False})
    server = await chunked_server(body, 6)
    timeout = aiohttp.ClientTimeout(total=30)
    try:
        async with aiohttp.ClientSession() as session:
            data = await request_json(
                session, "GET", str(server.make_url("/batches")), "list", {}, timeout
            )
            with pytest.raises(ProviderError, match="larger than"):
                server_big = await chunked_server(b" " * (MAX_JSON_BYTES + 10) + b"{}", 4)
                try:
                    await request_json(
                        session, "GET", str(server_big.make_url("/")), "list", {}, timeout
                    )
                finally:
                    await server_big.close()
    finally:
        await server.close()
    assert len(data["data"]) == 300 and data["has_more"] is False


def long_row(index: int, chars: int) -> OffloadLine:
    messages = [{"role": "user", "content": "x" * chars}]
    return OffloadLine(JOB, index, orjson.dumps(messages).decode(), '{"temperature": 0.5}')


@pytest.mark.parametrize("provider", ["openai-batch", "anthropic-batch"])
async def test_an_input_never_exceeds_max_bytes_the_rows_beyond_go_back_pending(
    tmp_path: Path, provider: str
) -> None:
    deployment = batch_deployment(provider)  # max_bytes 10,000
    client: Any = (
        openai_batch.OpenAIBatches(deployment, NO_SESSION)
        if provider == "openai-batch"
        else anthropic_batch.AnthropicBatches(deployment, NO_SESSION)
    )
    rows = [long_row(0, 12_000)] + [long_row(i, 3_000) for i in range(1, 6)]
    store = PagedLines(rows)
    built = await build_input(store, client, 9, str(tmp_path))  # type: ignore[arg-type]
    data = await asyncio.to_thread(Path(built.path).read_bytes)
    assert built.size == len(data) <= 10_000
    assert built.rows == 3
    marked = {state: keys for keys, state in store.marked}
    assert store.marked[0] == ([(JOB, 0)], RowState.FORWARD)
    assert sorted(k for keys, s in store.marked if s is RowState.PENDING for k in keys) == [
        (JOB, 4),
        (JOB, 5),
    ]
    assert RowState.PENDING in marked


@pytest.mark.parametrize("provider", ["openai-batch", "anthropic-batch"])
async def test_result_lines_are_parsed_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch, provider: str
) -> None:
    module: Any = openai_batch if provider == "openai-batch" else anthropic_batch
    if provider == "openai-batch":
        raw = [openai_output(i) for i in range(600)]
    else:
        raw = [
            orjson.dumps({"custom_id": f"5-{JOB}-{i}", "result": {"type": "expired"}})
            for i in range(600)
        ]
    server = await chunked_server(b"\n".join(raw) + b"\n", 5)
    loop_thread = threading.get_ident()
    threads: set[int] = set()
    parse = module.result_line

    def recorded(line: bytes, offload_id: int) -> ResultLine | None:
        threads.add(threading.get_ident())
        return cast(ResultLine | None, parse(line, offload_id))

    monkeypatch.setattr(module, "result_line", recorded)
    deployment = replace(batch_deployment(provider), base_url=str(server.make_url("/v1")))
    try:
        async with aiohttp.ClientSession() as session:
            client = (
                openai_batch.OpenAIBatches(deployment, session)
                if provider == "openai-batch"
                else anthropic_batch.AnthropicBatches(deployment, session)
            )
            state = ProviderState(True, 600, str(server.make_url("/v1/messages/batches/r")))
            if provider == "openai-batch":
                state = ProviderState(True, 600, "file-out")
            lines = [line async for line in client.results(state, 5)]
    finally:
        await server.close()
    assert sorted(line.row_index for line in lines) == list(range(600))
    assert threads and loop_thread not in threads
