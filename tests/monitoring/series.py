"""``python -m tests.monitoring.series [log folder]``: the samples each service's
``/metrics`` serves, on the e2e system (every service its own process, as the e2e tests
start it) idle, then after one 9-row batch (3 rows failing), as a table: all samples,
and those of ``relay_*`` series. The figures of docs/operations/metrics.md."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from relay_batches.services.relay_cli import admin
from tests.helpers.processes import SERVICES, System, running_system
from tests.helpers.support import ApiClient, rows

Counts = dict[str, tuple[int, int]]


async def count(http: aiohttp.ClientSession, system: System) -> Counts:
    """Per service: (all samples, ``relay_*`` samples)."""
    out = {}
    for name in SERVICES:
        port = system.processes[name].health_port()
        async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
            families = list(text_string_to_metric_families(await response.text()))
        relay = sum(len(f.samples) for f in families if f.name.startswith("relay_"))
        out[name] = (sum(len(f.samples) for f in families), relay)
    return out


async def measure(log_dir: Path) -> tuple[Counts, Counts]:
    """The counts idle and after a batch."""
    async with aiohttp.ClientSession() as http, running_system("series", log_dir, http) as system:
        idle = await count(http, system)
        key = (await admin.create_key(system.iso.database_url, "series")).key
        api = ApiClient(system.api_url, key, http)
        requests = rows(9)
        for request in requests[6:]:
            request["messages"][0]["content"] += " [sim:status=400]"
        created = await api.submit({"model": "gpt-4o-mini", "requests": requests})
        await api.wait_status(created["id"], {"completed"}, timeout=60)
        await asyncio.sleep(2)  # the last scrape-worthy moves (webhook-less: none left)
        return idle, await count(http, system)


def main(argv: list[str]) -> None:
    """Print the table."""
    log_dir = Path(argv[0] if argv else "test-output/monitoring/series-logs")
    idle, after = asyncio.run(measure(log_dir))
    print("| service | idle: all / relay_* | after a batch: all / relay_* |")
    print("|---|---|---|")
    for name in SERVICES:
        print(
            f"| {name} | {idle[name][0]} / {idle[name][1]} | {after[name][0]} / {after[name][1]} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
