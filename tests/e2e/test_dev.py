"""``relay dev`` (``make run``) as a user runs it: a real subprocess with its own children.

Each test runs ``relay dev`` on a fresh database and namespace, on a free API port and
simulator port and without a routes file (so the local routes must follow the simulator),
then stops it with SIGTERM and checks that it exits 0 and leaves no process behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.support import (
    ApiClient,
    Isolation,
    create_isolation,
    drop_isolation,
    free_port,
    rows,
    wait_until,
)

RELAY = Path(sys.executable).parent / "relay"
OLD_HEALTH_PORTS = range(9101, 9106)
STARTED = re.compile(r"\[relay dev\] (\S+) \(pid (\d+)\) started(?:; health (http://\S+/readyz))?")
KEY_LINE = re.compile(r"\[relay dev\] export RELAY_API_KEY=(\S+)")


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

    def api_key(self) -> str | None:
        """The dev key, once printed."""
        found = KEY_LINE.search(self.output())
        return found[1] if found else None


def _session_processes(session_id: int) -> list[int]:
    """Pids of every process still in session ``session_id`` (zombies included)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session_id:
                pids.append(int(stat.parent.name))
    return pids


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


def _spawn(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start ``relay dev`` in a session of its own, output to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [str(RELAY), "dev"],
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


@pytest.fixture
async def isolation() -> AsyncIterator[Isolation]:
    """A database and namespace of this test's own (no other service consumes them)."""
    iso = await create_isolation("dev")
    yield iso
    await drop_isolation(iso)


@contextlib.asynccontextmanager
async def relay_dev(
    iso: Isolation, log_path: Path, http: aiohttp.ClientSession, **env: str
) -> AsyncIterator[DevRun]:
    """Run ``relay dev`` until every service is started and the API answers; on leaving,
    SIGTERM it and insist on exit 0 with no process of its session left."""
    api_port, sim_port = free_port(), free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    proc_env = {
        **base,
        "RELAY_DATABASE_URL": iso.database_url,
        "RELAY_NAMESPACE": iso.namespace,
        "RELAY_API_PORT": str(api_port),
        "RELAY_SIM_PORT": str(sim_port),
        "RELAY_SHUTDOWN_GRACE_S": "10",
        **env,
    }
    process = _spawn(proc_env, log_path)
    run = DevRun(process, log_path, f"http://127.0.0.1:{api_port}", sim_port)
    try:
        await wait_until(lambda: _api_up(run, http), 60, f"relay dev's API (see {log_path})")
        yield run
    finally:
        code = _terminate(process)
    assert code == 0, f"relay dev exited {code}; see {log_path}"
    assert _session_processes(process.pid) == [], f"children left behind; see {log_path}"
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
            assert len(health) == 6  # every service but the simulator
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
