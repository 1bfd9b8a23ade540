"""Retention end to end: with ``RELAY_RETENTION=5s`` and a reaper pass every half
second, a finished job is purged (its GET answers 404) a few seconds after it ended,
while a job still running is kept however old it is.

A small system of its own (one of each service); the running job's single row takes
its upstream 30 s, and it is canceled at the end.
"""

from __future__ import annotations

import time

import aiohttp

from tests.helpers.processes import System, signed_in, system_fixture
from tests.helpers.support import rows, wait_until

RETENTION_S = 5.0
INTERVAL_S = 0.5


# Every service as its own process; ended jobs are kept 5 s.
retained = system_fixture(
    "retention", RELAY_RETENTION="5s", RELAY_RETENTION_INTERVAL_S=str(INTERVAL_S)
)


async def test_a_finished_job_is_purged_after_the_retention_and_a_running_one_stays(
    retained: System, http: aiohttp.ClientSession
) -> None:
    api = await signed_in(retained, http, "retain-a")
    slow = await api.submit({"model": "gpt-4o-mini", "requests": rows(1, "[sim:delay-ms=30000]")})
    await api.wait_status(slow["id"], {"running"}, timeout=30)
    quick = await api.submit({"model": "gpt-4o-mini", "requests": rows(2)})
    done = await api.wait_status(quick["id"], {"completed"}, timeout=30)
    ended = time.monotonic()
    assert done["completed"] == 2

    async def gone() -> bool:
        status, _ = await api.request("GET", f"/v1/batches/{quick['id']}")
        return status == 404

    await wait_until(gone, RETENTION_S + 10, "the finished job to be purged", every=0.25)
    assert time.monotonic() - ended >= RETENTION_S - 1  # not before its retention
    status, _ = await api.request("GET", f"/v1/batches/{quick['id']}/results")
    assert status == 404
    assert (await api.get(slow["id"]))["status"] == "running"
    status, _ = await api.request("POST", f"/v1/batches/{slow['id']}/cancel")
    assert status == 200
