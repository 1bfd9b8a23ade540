"""``relay dev`` (``make run``) as a user runs it: a real subprocess with its own children.

Each test runs ``relay dev`` on a fresh database and namespace, on a free API port and
simulator port and without a routes file (so the local routes must follow the simulator),
then stops it (SIGTERM, or kill -9) and checks that it exits 0 and that no child it
started is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import asyncpg

from tests.helpers.support import (
    ApiClient,
    Isolation,
    free_port,
    rows,
    wait_until,
)

RELAY = Path(sys.executable).parent / "relay"
OLD_HEALTH_PORTS = range(9101, 9106)
STARTED = re.compile(r"\[relay dev\] (\S+) \(pid (\d+)\) started(?:; health (http://\S+/readyz))?")
KEY_LINE = re.compile(r"\[relay dev\] ready: .* RELAY_API_KEY=(\S+)")


@dataclass
class DevRun:
    """One ``relay dev`` process and what it printed."""

    process: subprocess.Popen[bytes]
    log_path: Path
    api_url: str
    sim_port: int

    def output(self) -> str:
        """Everything ``relay dev`` and its children printed so far."""
        return self.log_path.read_text(errors="replace")

    def started(self) -> dict[str, tuple[int, str | None]]:
        """``name → (pid, health URL)`` from the last start line of each child."""
        return {m[1]: (int(m[2]), m[3]) for m in STARTED.finditer(self.output())}

    def child_pids(self) -> set[int]:
        """Every pid ``relay dev`` said it started (restarts included)."""
        return {int(m[2]) for m in STARTED.finditer(self.output())}

    def api_key(self) -> str | None:
        """The dev key, once the ready line printed it."""
        found = KEY_LINE.search(self.output())
        return found[1] if found else None


def _running(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (a zombie has ended; it only waits to be reaped)."""
    alive = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                alive.add(pid)
    return alive


@contextlib.contextmanager
def _held_ports(ports: range) -> Iterator[None]:
    """Listening sockets on ``ports``, as another program on the machine would hold them
    (a port some other program holds already is just as taken)."""
    with contextlib.ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            sock.listen()
        yield


def _spawn(
    env: dict[str, str], log_path: Path, args: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """Start ``relay dev ARGS`` in a session of its own, output to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [str(RELAY), "dev", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _terminate(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM and wait (the whole session is killed if it hangs); the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(40)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait(10)


def _argv(pid: int) -> list[str]:
    """The command line of process ``pid`` (a console script runs as python + script)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


@contextlib.asynccontextmanager
async def relay_dev(
    iso: Isolation,
    log_path: Path,
    http: aiohttp.ClientSession,
    args: tuple[str, ...] = (),
    **env: str,
) -> AsyncIterator[DevRun]:
    """Run ``relay dev ARGS`` until every service is started and the API answers; on
    leaving, SIGTERM it and insist on exit 0 with no process of its session left."""
    api_port, sim_port = free_port(), free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    proc_env = {
        **base,
        "RELAY_DATABASE_URL": iso.database_url,
        "RELAY_NAMESPACE": iso.namespace,
        "RELAY_API_PORT": str(api_port),
        "RELAY_SIM_PORT": str(sim_port),
        "RELAY_SHUTDOWN_GRACE_S": "10",
        "RELAY_DEV_KEY_FILE": str(log_path.with_suffix(".key")),
        **env,
    }
    process = _spawn(proc_env, log_path, args)
    run = DevRun(process, log_path, f"http://127.0.0.1:{api_port}", sim_port)
    try:
        await wait_until(lambda: _api_up(run, http), 60, f"relay dev's API (see {log_path})")
        yield run
    finally:
        code = _terminate(process)
    assert code == 0, f"relay dev exited {code}; see {log_path}"
    assert run.child_pids(), f"no child start line; see {log_path}"
    assert _running(run.child_pids()) == set(), f"children left behind; see {log_path}"
    assert "[relay dev] stopped" in run.output()


async def _api_up(run: DevRun, http: aiohttp.ClientSession) -> bool:
    if run.process.poll() is not None:
        raise AssertionError(f"relay dev exited {run.process.returncode}:\n{run.output()}")
    try:
        async with http.get(f"{run.api_url}/readyz", timeout=aiohttp.ClientTimeout(2)) as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def _ready(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(2)) as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def test_relay_dev_completes_a_batch_with_the_old_health_ports_taken(
    isolation: Isolation, http: aiohttp.ClientSession, output_dir: Path
) -> None:
    with _held_ports(OLD_HEALTH_PORTS):
        async with relay_dev(isolation, output_dir / "dev" / "held-ports.log", http) as run:
            started = run.started()
            assert {"upstream-sim", "ingest-api", "row-worker", "notifier"} <= set(started)
            assert f"simulator http://127.0.0.1:{run.sim_port}/v1" in run.output()
            health = [url for _, url in started.values() if url]
            assert len(health) == 7  # every service but the simulator
            assert not any(url.endswith(f":{p}/readyz") for url in health for p in OLD_HEALTH_PORTS)

            async def key_printed() -> str | None:
                return run.api_key()

            key = await wait_until(key_printed, 10, "the dev key line")
            api = ApiClient(run.api_url, key, http)
            batch = await api.submit({"model": "gpt-4o-mini", "requests": rows(5)})
            done = await api.wait_status(batch["id"], {"completed", "failed"}, 60)
            assert (done["status"], done["completed"], done["failed"]) == ("completed", 5, 0)
            async with http.get(f"http://127.0.0.1:{run.sim_port}/stats") as response:
                assert (await response.json())["calls"] == 5  # routes followed RELAY_SIM_PORT
            results = await api.results(batch["id"])
            assert results["data"] == [
                {"custom_id": f"r-{i}", "content": f"echo: row {i}"} for i in range(5)
            ]


async def test_relay_dev_starts_as_many_row_workers_as_asked(
    isolation: Isolation, http: aiohttp.ClientSession, output_dir: Path
) -> None:
    log = output_dir / "dev" / "three-workers.log"
    async with relay_dev(isolation, log, http, RELAY_DEV_ROW_WORKERS="3") as run:
        assert "[relay dev] 3 row-worker(s) (RELAY_DEV_ROW_WORKERS)" in run.output()
        workers = {n: v for n, v in run.started().items() if n.startswith("row-worker")}
        assert sorted(workers) == ["row-worker-1", "row-worker-2", "row-worker-3"]
        pids = {pid for pid, _ in workers.values()}
        urls = {url for _, url in workers.values()}
        assert len(pids) == 3 and len(urls) == 3 and None not in urls
        for url in urls:
            assert url is not None
            await wait_until(lambda u=url: _ready(http, u), 30, f"{url} to answer 200")
        for pid in pids:
            assert any(arg.endswith("/relay-row-worker") for arg in _argv(pid)[:2])


async def test_a_killed_relay_dev_leaves_no_service_running(
    isolation: Isolation, http: aiohttp.ClientSession, output_dir: Path
) -> None:
    log = output_dir / "dev" / "kill-9.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env = {
        **base,
        "RELAY_DATABASE_URL": isolation.database_url,
        "RELAY_NAMESPACE": isolation.namespace,
        "RELAY_API_PORT": str(free_port()),
        "RELAY_SIM_PORT": str(free_port()),
        "RELAY_DEV_KEY_FILE": str(log.with_suffix(".key")),
    }
    process = _spawn(env, log)
    run = DevRun(process, log, f"http://127.0.0.1:{env['RELAY_API_PORT']}", 0)
    try:
        await wait_until(lambda: _api_up(run, http), 60, f"relay dev's API (see {log})")
        children = run.child_pids()
        assert len(children) == 8  # the simulator, ingest-api and the six other services
        process.kill()
        process.wait(10)

        async def all_gone() -> bool:
            return not _running(children)

        await wait_until(all_gone, 40, f"every child to stop after its supervisor died ({log})")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        for pid in _running(run.child_pids()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_stopping_relay_dev_lets_rows_in_flight_finish(
    isolation: Isolation, http: aiohttp.ClientSession, output_dir: Path
) -> None:
    log = output_dir / "dev" / "stop-in-flight.log"
    async with relay_dev(isolation, log, http, RELAY_BATCH_CONCURRENCY="4") as run:

        async def key_printed() -> str | None:
            return run.api_key()

        api = ApiClient(run.api_url, await wait_until(key_printed, 10, "the dev key line"), http)
        job = await api.submit(
            {"model": "gpt-4o-mini", "requests": rows(40, "row {i} [sim:delay-ms=1500]")}
        )

        async def calls_made() -> bool:
            async with http.get(f"http://127.0.0.1:{run.sim_port}/stats") as response:
                return int((await response.json())["calls"]) >= 4

        await wait_until(calls_made, 30, "rows in flight at the simulator")
        # Leaving the block stops relay dev with SIGTERM while those rows are in flight.
    conn = await asyncpg.connect(isolation.database_url)
    try:
        recorded = await conn.fetch(
            "SELECT error, dead_letter FROM row_results WHERE batch_id = $1", job["id"]
        )
    finally:
        await conn.close()
    assert len(recorded) >= 4  # the rows in flight finished and were recorded
    assert [r for r in recorded if r["error"] is not None or r["dead_letter"]] == []


def _routes_deployments(pid: int) -> dict[str, dict[str, object]]:
    """The ``[deployments]`` of the routes file process ``pid`` was started with."""
    pairs = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    environ = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
    deployments: dict[str, dict[str, object]] = tomllib.loads(
        Path(environ["RELAY_ROUTES_FILE"]).read_text()
    )["deployments"]
    return deployments


async def test_relay_dev_rpm_makes_the_simulator_enforce_it_and_the_routes_carry_it(
    isolation: Isolation, http: aiohttp.ClientSession, output_dir: Path
) -> None:
    log = output_dir / "dev" / "rpm.log"
    async with relay_dev(isolation, log, http, RELAY_DEV_RPM="60") as run:
        assert (
            "[relay dev] rate limit 60 rpm: the simulator enforces it (429 above it, GET /stats), "
            "and deployments local-sim, local-sim-claude of the routes carry it"
        ) in run.output()
        started = run.started()
        worker_pid, _ = started["row-worker"]
        deployments = _routes_deployments(worker_pid)
        assert {name: d.get("rpm") for name, d in deployments.items()} == {
            "local-sim": 60,
            "local-sim-claude": 60,
        }
        assert deployments["local-sim"]["base_url"] == f"http://127.0.0.1:{run.sim_port}/v1"
        sim = f"http://127.0.0.1:{run.sim_port}"
        async with http.post(f"{sim}/reset") as response:
            assert response.status == 200
        body = {"model": "sim-echo", "messages": [{"role": "user", "content": "burst"}]}

        async def call() -> tuple[int, str | None]:
            async with http.post(f"{sim}/v1/chat/completions", json=body) as response:
                return response.status, response.headers.get("Retry-After")

        # 60 rpm is one call per calendar second: a burst of 6 at once gets 1 answer, or
        # 2 when it straddles a second's end; the rest are 429 with Retry-After: 1.
        answers = await asyncio.gather(*(call() for _ in range(6)))
        ok = sum(1 for status, _ in answers if status == 200)
        assert 1 <= ok <= 2, answers
        assert sorted(a for a in answers if a[0] != 200) == [(429, "1")] * (6 - ok)
        async with http.get(f"{sim}/stats") as response:
            stats = await response.json()
        assert stats == {
            "calls": 6,
            "ok": ok,
            "errors": 6 - ok,
            "throttled": 6 - ok,
            "batches_created": 0,
            "batch_rows": 0,
            "batch_rows_repeated": 0,
            "flex_calls": 0,
            "flex_refused": 0,
        }
