"""``X-Request-Id`` on the running ingest-api: a caller's safe id comes back on the
response and stands in every log line of that request; an unsafe or missing one is
replaced by a fresh id; every surface answers with one, errors and streamed bodies too."""

from __future__ import annotations

import re

import aiohttp
import orjson

from relay_batches.ids import new_id
from relay_batches.services.ingest_api.edge.request_id import HEADER, MAX_LENGTH
from tests.helpers.processes import System
from tests.helpers.support import ApiClient, rows, wait_until

FRESH = re.compile(r"[0-9a-f]{32}")


def _log_lines(system: System) -> list[dict[str, object]]:
    text = system.processes["ingest-api"].log_path.read_text()
    return [orjson.loads(line) for line in text.splitlines() if line.startswith("{")]


async def _answer_id(
    http: aiohttp.ClientSession, method: str, url: str, sent: str | None = None, **kw: object
) -> tuple[int, str]:
    headers = dict(kw.pop("headers", {}))  # type: ignore[call-overload]
    if sent is not None:
        headers[HEADER] = sent
    async with http.request(method, url, headers=headers, **kw) as response:  # type: ignore[arg-type]
        await response.read()
        return response.status, response.headers.get(HEADER, "")


async def test_a_callers_request_id_comes_back_and_marks_the_requests_log_lines(
    api: ApiClient, system: System, http: aiohttp.ClientSession
) -> None:
    sent = f"client-{new_id()[:8]}.submit:a/b+c=d@e_f"  # unique: the log outlives a run
    async with http.post(
        f"{system.api_url}/v1/batches",
        headers={"Authorization": f"Bearer {api.key}", HEADER: sent},
        json={"model": "gpt-4o-mini", "requests": rows(2)},
    ) as response:
        assert response.status == 201
        assert response.headers[HEADER] == sent
        batch_id = (await response.json())["id"]

    async def marked() -> list[dict[str, object]]:
        return [line for line in _log_lines(system) if line.get("request_id") == sent]

    lines = await wait_until(marked, 10, "the request's log lines")
    created = [line for line in lines if line["action"] == "batch_created"]
    assert [line["batch_id"] for line in created] == [batch_id]
    assert {line["service"] for line in lines} == {"ingest-api"}


async def test_an_unsafe_or_missing_request_id_is_replaced_by_a_fresh_one(
    system: System, http: aiohttp.ClientSession
) -> None:
    url = f"{system.api_url}/healthz"
    for unsafe in ("x" * (MAX_LENGTH + 1), "two words", 'quote"d', "", "é"):
        status, answered = await _answer_id(http, "GET", url, unsafe)
        assert status == 200
        assert FRESH.fullmatch(answered), (unsafe, answered)
    _, first = await _answer_id(http, "GET", url)
    _, second = await _answer_id(http, "GET", url)
    assert FRESH.fullmatch(first) and FRESH.fullmatch(second) and first != second
    _, longest = await _answer_id(http, "GET", url, "y" * MAX_LENGTH)
    assert longest == "y" * MAX_LENGTH


async def test_every_surface_answers_with_the_id_errors_and_streams_included(
    api: ApiClient, system: System, http: aiohttp.ClientSession
) -> None:
    created = await api.submit({"model": "gpt-4o-mini", "requests": rows(3)})
    await api.wait_status(created["id"], {"completed"}, timeout=60)
    auth = {"Authorization": f"Bearer {api.key}"}
    base = system.api_url
    cases = [
        ("GET", f"{base}/v1/batches/{created['id']}/results", auth, 200),  # streamed
        ("GET", f"{base}/v1/batches", {}, 401),  # no key
        ("GET", f"{base}/v1/batches/{'0' * 32}", auth, 404),
        ("POST", f"{base}/v1/batches", {**auth, "Content-Type": "text/plain"}, 415),
        ("GET", f"{base}/openai/v1/batches/nope", auth, 404),
        ("GET", f"{base}/anthropic/v1/messages/batches", {}, 401),
        ("GET", f"{base}/no/such/route", {}, 404),
        ("GET", f"{base}/readyz", {}, 200),
        ("GET", f"{base}/openapi.json", {}, 200),
    ]
    for n, (method, url, headers, expected) in enumerate(cases):
        sent = f"case-{n}"
        status, answered = await _answer_id(http, method, url, sent, headers=headers)
        assert (status, answered) == (expected, sent), (method, url)
