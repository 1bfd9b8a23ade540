"""Benchmark plumbing: systems to measure, the ideal client, RSS sampling, statistics."""

from __future__ import annotations

import asyncio
import io
import os
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson

from relay_batches.services.relay_cli import admin
from tests.helpers.processes import System, build_system
from tests.helpers.support import (
    PG_ADMIN_URL,
    ApiClient,
    create_isolation,
    drop_isolation,
    rows,
)

RUNS = 3
MIB = 1024 * 1024


@dataclass
class Figure:
    """Repeated measurements of one quantity."""

    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        """The median sample."""
        return statistics.median(self.samples)

    def keys(self, name: str) -> dict[str, float]:
        """``name``, ``name_min``, ``name_max`` for the report."""
        return {
            name: round(self.median, 3),
            f"{name}_min": round(min(self.samples), 3),
            f"{name}_max": round(max(self.samples), 3),
        }


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far (``/proc/stat``)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal
    return total - idle, total


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the machine's CPU time that was busy between two :func:`machine_ticks`."""
    return (after[0] - before[0]) / max(after[1] - before[1], 1)


def other_busy_share(
    before: tuple[int, int], after: tuple[int, int], measured_cpu_s: float
) -> float:
    """The share of the machine's CPU time between two :func:`machine_ticks` that was
    busy with something other than ``measured_cpu_s`` (the CPU seconds of every process
    a benchmark accounts for: the system under test, its servers, the simulator and the
    bench itself): near 0 on a quiet machine; other work running meanwhile (a test
    run, an apt install) shows here, and the figures beside it are not a quiet reading."""
    ticks = os.sysconf("SC_CLK_TCK")
    busy_s = (after[0] - before[0]) / ticks
    total_s = max(after[1] - before[1], 1) / ticks
    return max(0.0, busy_s - measured_cpu_s) / total_s


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds ``pid`` has used (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """Resident set size of ``pid`` in MiB (``field="VmHWM"``: its peak so far)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` after the command name: [0] state, [1] ppid, [11..14]
    utime, stime, cutime, cstime."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and every process under it, exited ones included.

    Each live process counts its own user + system time plus its reaped children's
    (cutime + cstime): a backend or autovacuum worker that ends between two samples was
    counted live at the first and lands in the postmaster's cutime/cstime at the second,
    so the difference of two samples is all the tree's CPU in between.
    """
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry.name))
        except (FileNotFoundError, ProcessLookupError):
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = sum(int(f) for f in fields[11:15])
    members, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        members.update(children)
        frontier.extend(children)
    return sum(times.get(pid, 0) for pid in members) / os.sysconf("SC_CLK_TCK")


async def postmaster_pid(admin: asyncpg.Connection) -> int | None:
    """The Postgres server's postmaster, the parent of our backend, if it runs here."""
    backend = int(await admin.fetchval("SELECT pg_backend_pid()"))
    try:
        return int(_stat_fields(backend)[1])
    except (FileNotFoundError, ProcessLookupError):
        return None


def rabbitmq_pid() -> int | None:
    """The RabbitMQ node's Erlang VM (``beam.smp``), if it runs on this machine."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith("beam"):
                return int(entry.name)
    return None


@dataclass
class CpuMeter:
    """CPU seconds of every Relay process plus Postgres' and RabbitMQ's process trees.

    The simulator and the bench's own process (the ideal client) are left out: the figure
    is what the pipeline itself burns.
    """

    relay_pids: list[int]
    postmaster: int | None
    beam: int | None

    @classmethod
    async def for_bench(cls, bench: Bench) -> CpuMeter:
        """The meter of ``bench``'s services and the servers it talks to."""
        admin = await asyncpg.connect(PG_ADMIN_URL)
        try:
            postmaster = await postmaster_pid(admin)
        finally:
            await admin.close()
        return cls(list(bench.pids().values()), postmaster, rabbitmq_pid())

    def seconds(self) -> float:
        """CPU seconds used so far by every process the meter watches."""
        total = sum(tree_cpu_s(pid) for pid in self.relay_pids)
        for root in (self.postmaster, self.beam):
            total += tree_cpu_s(root) if root else 0.0
        return total


class RssSampler:
    """Samples the RSS of processes every few ms while running; keeps each one's peak."""

    def __init__(self, pids: dict[str, int], every_s: float = 0.05) -> None:
        self._pids = pids
        self._every = every_s
        self.peaks: dict[str, float] = dict.fromkeys(pids, 0.0)
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        while True:
            for name, pid in self._pids.items():
                self.peaks[name] = max(self.peaks[name], rss_mib(pid))
            await asyncio.sleep(self._every)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.get_running_loop().create_task(self._loop())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


@dataclass
class Bench:
    """A running system plus a signed-in client."""

    system: System
    api: ApiClient
    http: aiohttp.ClientSession
    database_url: str = ""  # to sign in further workspaces (admin.create_key)

    def pids(self) -> dict[str, int]:
        """Service name → pid for every Relay service (not the simulator)."""
        return {
            name: proc.pid for name, proc in self.system.processes.items() if name != "upstream-sim"
        }

    async def post(self, body: bytes) -> dict[str, Any]:
        """POST an encoded batch body; insist on 201 and return the created batch."""
        async with self.http.post(
            f"{self.api.base_url}/v1/batches",
            data=io.BytesIO(body),
            headers={"Authorization": f"Bearer {self.api.key}", "Content-Type": "application/json"},
        ) as response:
            created: dict[str, Any] = await response.json()
            assert response.status == 201, created
            return created

    async def run_batch(self, n: int, template: str = "row {i}") -> tuple[float, float]:
        """Submit ``n`` rows, wait for ``completed``; return (submit seconds, total seconds)."""
        body = orjson.dumps({"model": "gpt-4o-mini", "requests": rows(n, template)})
        started = time.perf_counter()
        created = await self.post(body)
        submitted = time.perf_counter() - started
        await self.wait_completed(created["id"], n)
        return submitted, time.perf_counter() - started

    async def wait_completed(self, batch_id: str, n: int) -> None:
        """Poll the batch every 50 ms until it is completed with every row."""
        while True:
            batch = await self.api.get(batch_id)
            if batch["status"] == "completed":
                assert batch["completed"] == n, batch
                return
            assert batch["status"] in {"queued", "running"}, batch
            await asyncio.sleep(0.05)


@asynccontextmanager
async def bench_system(
    out: Path,
    tag: str,
    http: aiohttp.ClientSession,
    *,
    workers: int = 1,
    concurrency: int = 32,
    latency_ms: int = 0,
    sim_env: Mapping[str, str] | None = None,
    limits: Mapping[str, int] | None = None,
    **env: str,
) -> AsyncIterator[Bench]:
    """A whole system on a fresh database, torn down afterwards; ``sim_env`` adds to the
    simulator's environment (``RELAY_SIM_RPM``…), ``limits`` are the routes' rate-limit
    keys of the ``gpt-4o-mini`` deployment (see :func:`build_system`)."""
    iso = await create_isolation(f"bench{tag}")
    system = build_system(
        iso,
        out / f"bench-{tag}",
        workers=workers,
        sim_env={"RELAY_SIM_LATENCY_MS": str(latency_ms), **(sim_env or {})},
        limits=limits,
        RELAY_BATCH_CONCURRENCY=str(concurrency),
        **env,
    )
    try:
        await system.start_all(http)
        key = (await admin.create_key(iso.database_url, "bench")).key
        yield Bench(system, ApiClient(system.api_url, key, http), http, iso.database_url)
    finally:
        system.stop_all()
        await drop_isolation(iso)


async def ideal_client(sim_url: str, n: int, concurrency: int) -> float:
    """Seconds for a plain asyncio client to send ``n`` chat requests with ``concurrency``."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                body = {"model": "sim-echo", "messages": [{"role": "user", "content": f"row {i}"}]}
                async with session.post(
                    f"{sim_url}/v1/chat/completions",
                    data=orjson.dumps(body),
                    headers={"Content-Type": "application/json"},
                ) as response:
                    data: Any = await response.json()
                    assert response.status == 200, data

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


async def repeat(runs: int, measure: Callable[[], Awaitable[float]]) -> Figure:
    """Run ``measure`` ``runs`` times."""
    figure = Figure()
    for _ in range(runs):
        figure.samples.append(await measure())
    return figure


def openai_chat_file(rows: int, pad: str, **body: Any) -> bytes:
    """An OpenAI batch input file of ``rows`` ``/v1/chat/completions`` lines, row ``i``
    saying ``row i <pad>``, with ``body`` in each request body."""
    return b"".join(
        orjson.dumps(
            {
                "custom_id": f"r-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "gpt-4o-mini",
                    "messages": [{"role": "user", "content": f"row {i} {pad}"}],
                    **body,
                },
            }
        )
        + b"\n"
        for i in range(rows)
    )


async def upload_jsonl(
    bench: Bench, data: bytes, filename: str, timeout: aiohttp.ClientTimeout | None = None
) -> dict[str, Any]:
    """``POST /v1/batches/upload`` of ``data`` as one .jsonl file; insists on 201; the
    answer."""
    form = aiohttp.FormData()
    form.add_field("model", "gpt-4o-mini")
    form.add_field("file", io.BytesIO(data), filename=filename, content_type="application/x-ndjson")
    async with bench.http.post(
        f"{bench.api.base_url}/v1/batches/upload",
        data=form,
        headers={"Authorization": f"Bearer {bench.api.key}"},
        timeout=timeout or bench.http.timeout,
    ) as response:
        text = await response.text()
        assert response.status == 201, text
    answer: dict[str, Any] = orjson.loads(text)
    return answer


async def create_openai_batch(bench: Bench, input_file_id: str) -> tuple[int, Any]:
    """``POST /openai/v1/batches`` of an uploaded file, chat completions within 24h; the
    status and the answer."""
    return await bench.api.request(
        "POST",
        "/openai/v1/batches",
        json={
            "input_file_id": input_file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
