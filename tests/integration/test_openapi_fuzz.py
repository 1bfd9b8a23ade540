"""Schemathesis drives a live ingest-api process (real Postgres and RabbitMQ) from the
process's own ``/openapi.json``: no 5xx, and every status code, content type, header and
body exactly as documented.

The process runs on a database and namespace of its own, seeded with batches in several
states (finished with results and dead letters, scheduled, canceled) so the responses
schemathesis checks are not only empty lists and 404s. Only the ingest-api runs there:
nothing calls a model or delivers to the webhook URLs schemathesis invents.

``make test`` runs a bounded number of examples per operation; ``make fuzz`` runs far
more (``RELAY_FUZZ_EXAMPLES``; ``RELAY_FUZZ_SEED`` fixes the seed, empty for a random one).
The JSON report and the full output land in ``test-output/openapi/``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.outcomes import OutcomeStore
from relay_batches.ledger.pool import create_pool
from relay_batches.messages import RowOutcome
from relay_batches.services.ingest_api.openapi import load_document
from relay_batches.services.relay_cli import admin
from tests.helpers.openapi_ops import (
    component_validator,
    documented_operations,
    registered_operations,
)
from tests.helpers.processes import BIN, build_system
from tests.helpers.support import ApiClient, Isolation, create_isolation, drop_isolation, rows

FUZZ_EXAMPLES = int(os.environ.get("RELAY_FUZZ_EXAMPLES", "12"))
FUZZ_SEED = os.environ.get("RELAY_FUZZ_SEED", "5")
FUZZ_TIMEOUT_S = float(os.environ.get("RELAY_FUZZ_TIMEOUT_S", "100"))
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
)
NDJSON = "application/x-ndjson"
DOC = load_document()


@dataclass(frozen=True)
class LiveApi:
    """The running ingest-api and a client of it."""

    iso: Isolation
    api: ApiClient
    log_dir: Path


@dataclass(frozen=True)
class Seeded:
    """Batches put in place before the run: one finished with a result and a dead letter."""

    finished_id: str


@pytest.fixture(scope="module")
async def live_api(output_dir: Path, http: aiohttp.ClientSession) -> AsyncIterator[LiveApi]:
    """``relay-ingest-api`` as its own OS process on a fresh database and namespace."""
    iso = await create_isolation("oas")
    log_dir = (output_dir / "openapi").resolve()  # schemathesis runs from there
    system = build_system(iso, log_dir)
    process = system.processes["ingest-api"]
    try:
        process.start()
        await process.wait_ready(http)
        created = await admin.create_key(iso.database_url, "openapi-fuzz")
        yield LiveApi(iso, ApiClient(system.api_url, created.key, http), log_dir)
    finally:
        code = process.stop()
        await drop_isolation(iso)
    assert code == 0, f"ingest-api exited with {code}; see {process.log_path}"


@pytest.fixture(scope="module")
async def seeded(live_api: LiveApi) -> Seeded:
    """A finished batch (one content row, one dead-lettered error row), a canceled one and
    a cron template, created over HTTP; the finished one's outcomes recorded in the ledger
    as the aggregator would (only its batch is queued when it is claimed)."""
    api = live_api.api
    finished = await api.submit({"model": "gpt-4o-mini", "name": "seed", "requests": rows(2)})
    pool = await create_pool(live_api.iso.database_url, max_size=2)
    try:
        claimed = await DispatchStore(pool).claim_queued("openapi-seed", 10, 30)
        assert [job.id for job in claimed] == [finished["id"]]
        await OutcomeStore(pool).record(
            [
                RowOutcome(finished["id"], 0, "echo: row 0", None, 1, prompt_tokens=3),
                RowOutcome(finished["id"], 1, None, "upstream_error: sim: 503", 4, True),
            ]
        )
    finally:
        await pool.close()
    canceled = await api.submit({"model": "gpt-4o-mini", "requests": rows(1)})
    status, _ = await api.request("POST", f"/v1/batches/{canceled['id']}/cancel")
    assert status == 200
    await api.submit({"model": "gpt-4o-mini", "requests": rows(1), "cron": "0 9 * * 1"})
    return Seeded(finished["id"])


async def get_raw(
    http: aiohttp.ClientSession, api: ApiClient, path: str, accept: str
) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET with ``accept``."""
    headers = {"Authorization": f"Bearer {api.key}", "Accept": accept}
    async with http.get(api.base_url + path, headers=headers) as response:
        return response.status, response.content_type, await response.read()


@pytest.mark.parametrize(
    ("suffix", "document", "row", "expected"),
    [
        ("results", "Results", "ResultRow", 2),
        ("dead_letter", "DeadLetters", "DeadLetterRow", 1),
    ],
)
async def test_streamed_lists_match_their_schemas_as_json_and_as_ndjson(
    live_api: LiveApi,
    seeded: Seeded,
    http: aiohttp.ClientSession,
    suffix: str,
    document: str,
    row: str,
    expected: int,
) -> None:
    # Schemathesis has no ndjson reader, so the ndjson form is checked here, line by line.
    path = f"/v1/batches/{seeded.finished_id}/{suffix}"
    status, content_type, body = await get_raw(http, live_api.api, path, NDJSON)
    assert (status, content_type) == (200, NDJSON)
    lines = body.splitlines()
    assert len(lines) == expected and body.endswith(b"\n")
    for line in lines:
        component_validator(DOC, row).validate(orjson.loads(line))

    status, content_type, body = await get_raw(http, live_api.api, path, "application/json")
    assert (status, content_type) == (200, "application/json")
    component_validator(DOC, document).validate(orjson.loads(body))
    assert len(orjson.loads(body)["data"]) == expected


def schemathesis_command(
    live_api: LiveApi, report: Path, exclude: set[tuple[str, str]]
) -> list[str]:
    """The ``st run`` command line: every check about what the API answers."""
    api = live_api.api
    command = [
        str(BIN / "st"),
        "run",
        f"{api.base_url}/openapi.json",
        "--checks",
        ",".join(CHECKS),
        "--header",
        f"Authorization: Bearer {api.key}",
        "--max-examples",
        str(FUZZ_EXAMPLES),
        "--workers",
        "2",
        "--request-timeout",
        "30",
        "--generation-database",
        "none",
        "--report",
        "json",
        "--report-json-path",
        str(report),
        "--no-color",
    ]
    if FUZZ_SEED:
        command += ["--seed", FUZZ_SEED]
    for _, path in sorted(exclude):
        command += ["--exclude-path", path]
    return command


async def run_schemathesis(command: list[str], cwd: Path, transcript: Path) -> int:
    """Run ``command``, its output to ``transcript``; kill it past the time budget."""
    with transcript.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *command, cwd=cwd, stdout=out, stderr=asyncio.subprocess.STDOUT
        )
        try:
            return await asyncio.wait_for(process.wait(), FUZZ_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise AssertionError(
                f"schemathesis still running after {FUZZ_TIMEOUT_S}s; see {transcript}"
            ) from None


def summary(report: dict[str, Any]) -> str:
    """One line for the log: what was generated and what was found."""
    cases = report["test_cases"]
    return (
        f"schemathesis: {cases['generated']} test cases generated against"
        f" {report['operations']['tested']} operations in {report['running_time']:.1f}s"
        f" (seed {report['seed']}), {len(report['failures'])} failures,"
        f" {len(report['errors'])} errors"
    )


async def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    live_api: LiveApi, seeded: Seeded, api_server: TestServer
) -> None:
    # Only operations the app routes are fuzzed (the route test keeps both lists equal).
    exclude = documented_operations(DOC) - registered_operations(api_server.app)
    report_path = live_api.log_dir / "schemathesis.json"
    transcript = live_api.log_dir / "schemathesis.txt"
    command = schemathesis_command(live_api, report_path, exclude)

    code = await run_schemathesis(command, live_api.log_dir, transcript)

    output = transcript.read_text(errors="replace")
    assert report_path.exists(), output[-4000:]
    report = json.loads(report_path.read_bytes())  # json, not orjson: the seed exceeds 64 bits
    print(summary(report))
    assert (code, report["failures"], report["errors"]) == (0, [], []), output[-8000:]
    assert report["complete"] and report["stop_reason"] == "completed", output[-4000:]
    # Schemathesis leaves out the operation serving the document it loaded (GET
    # /openapi.json); test_openapi_routes.py checks what that one serves.
    operations = report["operations"]
    expected = len(documented_operations(DOC) - exclude - {("GET", "/openapi.json")})
    assert operations["tested"] == operations["selected"] == expected, operations
    assert report["test_cases"]["generated"] >= 10 * operations["tested"]
