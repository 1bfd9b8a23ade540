"""The simulator's answers per request (``GET /stats/answers``): what a test reads to
tell how many rows were paid for twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from relay_batches.services.upstream_sim.answers import AnswerCounts
from relay_batches.services.upstream_sim.app import build_app
from relay_batches.services.upstream_sim.config import SimConfig
from relay_batches.services.upstream_sim.echo import ChatRequest

CHAT = "/v1/chat/completions"
Client = TestClient[aiohttp.web.Request, aiohttp.web.Application]


async def _instant(_seconds: float) -> None:
    await asyncio.sleep(0)


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    """A simulator answering at once."""
    client: Client = TestClient(TestServer(build_app(SimConfig(), sleep=_instant)))
    await client.start_server()
    yield client
    await client.close()


def _body(content: str, model: str = "m-1") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}]}


async def _answers(client: Client) -> Any:
    async with client.get("/stats/answers") as response:
        assert response.status == 200
        return await response.json()


async def test_a_request_answered_twice_counts_one_extra_answer(client: Client) -> None:
    for content in ("row 1", "row 2", "row 1", "row 1"):
        async with client.post(CHAT, json=_body(content)) as response:
            assert response.status == 200
    answers = await _answers(client)
    assert answers["requests_answered"] == 2
    assert answers["answers"] == 4
    assert answers["extra_answers"] == 2
    assert answers["rows_answered_twice"] == 1
    assert answers["most_answers"] == 3
    assert answers["extra_begun"] == 2
    assert len(answers["repeated_first_answered_at"]) == 1


async def test_errors_are_not_answers_and_reset_forgets(client: Client) -> None:
    async with client.post(CHAT, json=_body("row 1 [sim:status=500]")) as response:
        assert response.status == 500
    async with client.post(CHAT, json=_body("row 2")) as response:
        assert response.status == 200
    async with client.post(CHAT, json=_body("row 2", model="m-2")) as response:
        assert response.status == 200  # another model: another request
    answers = await _answers(client)
    assert (answers["answers"], answers["extra_answers"], answers["begun"]) == (2, 0, 2)
    async with client.post("/reset") as response:
        assert response.status == 200
    assert (await _answers(client))["answers"] == 0


def test_counts_stop_growing_at_capacity_but_keep_counting_known_requests() -> None:
    counts = AnswerCounts(capacity=1, clock=lambda: 12.5)
    one, two = ChatRequest("m", ("a",), "a"), ChatRequest("m", ("b",), "b")
    for chat in (one, two, one):
        counts.begin(chat)
        counts.answer(chat)
    summary = counts.summary()
    assert (summary["requests_answered"], summary["answers"], summary["extra_answers"]) == (1, 2, 1)
    assert summary["repeated_first_answered_at"] == [12.5]
