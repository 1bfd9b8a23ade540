"""A results stream that fails after its headers went out must end as a broken transfer.

The status line and some rows are on the wire already, so no error object can follow:
the server has to abort the connection, and every client (curl, a script, ``relay batch
results -o``) must see an incomplete transfer, never a clean 200 with a cut body.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from relay_batches.bus.client import Bus
from relay_batches.errors import TransientError
from relay_batches.ledger.jobs import DeadLetterRow, JobStore, ResultRow
from relay_batches.model import Job
from relay_batches.router.aliases import AliasTable
from relay_batches.services.relay_cli import admin
from tests.helpers.api import start_api
from tests.helpers.support import ApiClient, Isolation, run_relay

CLI_TIMEOUT_S = 60
ROW = {"role": "user", "content": "hi"}


class BrokenJobs(JobStore):
    """The real JobStore, except that listing rows fails after the first page, and
    listing batches fails at once (the database went away before any byte was sent)."""

    async def list_page(self, *args: Any, **kwargs: Any) -> tuple[list[Job], bool]:
        raise TransientError("database unavailable")

    async def _first_page_then_outage(self, page: list[object]) -> AsyncIterator[list[object]]:
        yield page
        raise TransientError("database unavailable")

    def result_pages(
        self, batch: Job, page_rows: int = 0, outcome: str | None = None
    ) -> AsyncIterator[list[ResultRow]]:
        page = [ResultRow(0, "c-0", "first row", None)]
        return self._first_page_then_outage(page)  # type: ignore[arg-type, return-value]

    def dead_letter_pages(
        self, batch: Job, page_rows: int = 0
    ) -> AsyncIterator[list[DeadLetterRow]]:
        page = [DeadLetterRow(0, "c-0", "upstream_error: sim: 503", 3)]
        return self._first_page_then_outage(page)  # type: ignore[arg-type, return-value]


@pytest.fixture(scope="module")
async def broken_api(
    iso: Isolation, pool: asyncpg.Pool, bus: Bus, aliases: AliasTable, http: aiohttp.ClientSession
) -> AsyncIterator[ApiClient]:
    """An ingest-api whose row listings break mid-stream, and a client of it."""
    server = await start_api(pool, bus, aliases, BrokenJobs(pool))
    created = await admin.create_key(iso.database_url, "stream-abort")
    yield ApiClient(str(server.make_url("")).rstrip("/"), created.key, http)
    await server.close()


async def canceled_batch(api: ApiClient) -> str:
    """A terminal batch (canceled), so its results are served."""
    batch = await api.submit({"model": "gpt-4o-mini", "requests": [{"messages": [ROW]}] * 3})
    status, body = await api.request("POST", f"/v1/batches/{batch['id']}/cancel")
    assert status == 200, body
    return str(batch["id"])


@pytest.mark.parametrize("path", ["results", "dead_letter"])
@pytest.mark.parametrize("accept", ["application/json", "application/x-ndjson"])
async def test_a_page_failing_mid_stream_breaks_the_transfer(
    broken_api: ApiClient, http: aiohttp.ClientSession, path: str, accept: str
) -> None:
    batch_id = await canceled_batch(broken_api)
    async with http.get(
        f"{broken_api.base_url}/v1/batches/{batch_id}/{path}",
        headers={"Authorization": f"Bearer {broken_api.key}", "Accept": accept},
        timeout=aiohttp.ClientTimeout(30),
    ) as response:
        assert response.status == 200  # sent before the failure: it cannot be taken back
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


async def test_the_abort_is_logged_once(
    broken_api: ApiClient, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    batch_id = await canceled_batch(broken_api)
    with caplog.at_level(logging.INFO):
        async with http.get(
            f"{broken_api.base_url}/v1/batches/{batch_id}/results",
            headers={"Authorization": f"Bearer {broken_api.key}"},
            timeout=aiohttp.ClientTimeout(30),
        ) as response:
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()
    failures = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [(r.name, r.getMessage()) for r in failures] == [("relay.ingest_api", "stream_aborted")]
    assert "database unavailable" in str(failures[0].__dict__["error"])


async def test_relay_batch_results_fails_on_a_broken_transfer(
    broken_api: ApiClient, tmp_path: Path
) -> None:
    batch_id = await canceled_batch(broken_api)
    out = tmp_path / "out.jsonl"
    env = {**os.environ, "RELAY_URL": broken_api.base_url, "RELAY_API_KEY": broken_api.key}
    code, _, err = await run_relay(
        "batch", "results", batch_id, "-o", str(out), env=env, timeout_s=CLI_TIMEOUT_S
    )
    assert code == 1, err
    assert b"incomplete" in err, err
    assert not out.exists()
    assert not (tmp_path / "out.jsonl.part").exists()


async def test_an_outage_before_the_answer_began_is_a_503(broken_api: ApiClient) -> None:
    status, body = await broken_api.request("GET", "/v1/batches")
    assert status == 503
    assert body == {
        "error": {
            "type": "internal_error",
            "message": "service temporarily unavailable, retry shortly",
            "param": None,
        }
    }
