"""Running Relay's services as real OS processes for e2e and chaos tests."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from relay_batches.dialects.endpoints import ALL_ENDPOINTS
from relay_batches.services.relay_cli import admin
from tests.helpers.support import (
    ApiClient,
    Isolation,
    create_isolation,
    drop_isolation,
    free_port,
    wait_until,
)

BIN = Path(sys.executable).parent
SERVICES = (
    "ingest-api",
    "scheduler",
    "dispatcher",
    "row-worker",
    "aggregator",
    "notifier",
    "offloader",
)
_PORT_LINE = re.compile(rb'"action":"(?:health_listening|listening|started)".*?"port":(\d+)')


@dataclass
class ServiceProcess:
    """One service process with its log file."""

    name: str
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def command(self) -> list[str]:
        """How it starts: its console script; the simulator (dev-only, no console
        script) as the module it is."""
        if self.name == "upstream-sim":
            return [sys.executable, "-m", "relay_batches.services.upstream_sim"]
        return [str(BIN / f"relay-{self.name.split('#')[0]}")]

    def start(self) -> None:
        """Start (or restart) the process, appending to its log."""
        self.starts += 1
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            self.command(),
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    @property
    def pid(self) -> int:
        """The current process id."""
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process."""
        if self.alive():
            assert self.process is not None
            os.kill(self.process.pid, sig)

    def wait(self, timeout: float) -> int:
        """Wait for exit; return the exit code."""
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM, wait, SIGKILL if it hangs; return the exit code."""
        if self.process is None:
            return None
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait(10)

    def health_port(self) -> int | None:
        """The port from the last start's log line, once it is written."""
        if not self.log_path.exists():
            return None
        found = _PORT_LINE.findall(self.log_path.read_bytes())
        return int(found[-1]) if found else None

    async def wait_ready(self, session: aiohttp.ClientSession, timeout: float = 30) -> None:
        """Wait until ``/readyz`` answers 200 on the current process."""

        async def ready() -> bool:
            if not self.alive():
                raise AssertionError(f"{self.name} exited; see {self.log_path}")
            port = self.health_port()
            if port is None:
                return False
            path = "/healthz" if self.name == "upstream-sim" else "/readyz"
            try:
                async with session.get(
                    f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(2)
                ) as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(ready, timeout, f"{self.name} to be ready")


@dataclass
class System:
    """The whole system: simulator plus services, each its own process."""

    iso: Isolation
    log_dir: Path
    api_port: int
    sim_port: int
    base_env: dict[str, str]
    processes: dict[str, ServiceProcess] = field(default_factory=dict)

    @property
    def api_url(self) -> str:
        """Base URL of the public API."""
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def sim_url(self) -> str:
        """Base URL of the upstream simulator."""
        return f"http://127.0.0.1:{self.sim_port}"

    def add(self, name: str, **env: str) -> ServiceProcess:
        """Create (not start) a process ``name`` (``row-worker#2`` for a second worker)."""
        proc_env = {**self.base_env, **env}
        log_path = self.log_dir / f"{name.replace('#', '-')}.log"
        proc = ServiceProcess(name, proc_env, log_path)
        self.processes[name] = proc
        return proc

    async def start_all(self, session: aiohttp.ClientSession) -> None:
        """Start every process and wait until each is ready."""
        for proc in self.processes.values():
            proc.start()
        for proc in self.processes.values():
            await proc.wait_ready(session)

    def stop_all(self) -> dict[str, int | None]:
        """SIGTERM everything; return exit codes."""
        return {name: proc.stop() for name, proc in self.processes.items()}


def build_system(
    iso: Isolation,
    log_dir: Path,
    *,
    workers: int = 1,
    sim_env: dict[str, str] | None = None,
    max_retries: int = 3,
    limits: Mapping[str, int] | None = None,
    **overrides: str,
) -> System:
    """Describe a system for ``iso``: routes file, environment, every process.

    ``limits`` are rate-limit keys (``rpm``, ``tpm``) of the ``sim`` deployment that
    ``gpt-4o-mini`` goes to, e.g. ``{"rpm": 600}``; the simulator's own limits are its
    environment (``sim_env={"RELAY_SIM_RPM": "600"}``).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    sim_port, api_port = free_port(), free_port()
    limit_lines = "".join(f"{key} = {value}\n" for key, value in (limits or {}).items())
    routes = log_dir / "routes.toml"
    routes.write_text(
        '[aliases."gpt-4o-mini"]\ndeployments = ["sim"]\npatterns = ["gpt-4o-mini-*"]\n\n'
        '[aliases.sim-claude]\ndeployments = ["sim-claude"]\n\n'
        '[aliases.sim-priced]\ndeployments = ["sim-priced"]\n\n'
        '[aliases."text-embedding-3-small"]\ndeployments = ["sim"]\n\n'
        # A chat-only deployment first: a row of another endpoint falls through it.
        '[aliases.sim-fallback]\ndeployments = ["sim-priced", "sim"]\n\n'
        "[deployments.sim]\n"
        'provider = "openai"\n'
        f'base_url = "http://127.0.0.1:{sim_port}/v1"\n'
        f'model = "sim-echo"\ntimeout_s = 30\nmax_retries = {max_retries}\n'
        f"endpoints = {list(ALL_ENDPOINTS)!r}\n".replace("'", '"')
        + f"{limit_lines}\n"
        "[deployments.sim-claude]\n"
        'provider = "anthropic"\n'
        f'base_url = "http://127.0.0.1:{sim_port}/v1"\n'
        f'model = "sim-claude"\ntimeout_s = 30\nmax_retries = {max_retries}\n'
        'endpoints = ["/v1/chat/completions", "/v1/responses"]\n'
        'headers = { "x-api-key" = "sim" }\n\n'
        # A priced alias on the simulator: a few tokens cost a visible fraction of a cent.
        "[deployments.sim-priced]\n"
        'provider = "openai"\n'
        f'base_url = "http://127.0.0.1:{sim_port}/v1"\n'
        f'model = "sim-echo"\ntimeout_s = 30\nmax_retries = {max_retries}\n'
        "price = { prompt_per_mtok = 1000.0, completion_per_mtok = 2000.0 }\n"
        f"{offload_routes(sim_port, max_retries)}"
        # Priced with a cached rate: prompt tokens read from the cache cost a tenth.
        '\n[aliases.sim-cached]\ndeployments = ["sim-cached"]\n\n'
        "[deployments.sim-cached]\n"
        'provider = "openai"\n'
        f'base_url = "http://127.0.0.1:{sim_port}/v1"\n'
        f'model = "sim-echo"\ntimeout_s = 30\nmax_retries = {max_retries}\n'
        "price = { prompt_per_mtok = 1000.0, completion_per_mtok = 2000.0,"
        " cached_prompt_per_mtok = 100.0 }\n"
    )
    env = {
        **os.environ,
        "RELAY_DATABASE_URL": iso.database_url,
        "RELAY_NAMESPACE": iso.namespace,
        "RELAY_ROUTES_FILE": str(routes),
        "RELAY_API_PORT": str(api_port),
        "RELAY_HEALTH_PORT": "0",
        "RELAY_RECONCILE_SECONDS": "0.5",
        # Opt-in webhook retries come fractions of a second apart (the default is 30 s).
        "RELAY_WEBHOOK_RETRY_BASE_S": "0.2",
        "RELAY_WEBHOOK_ALLOW_NETWORKS": "127.0.0.0/8,::1/128",
        "RELAY_SHUTDOWN_GRACE_S": "10",
        **overrides,
    }
    system = System(iso, log_dir, api_port, sim_port, env)
    system.add("upstream-sim", RELAY_SIM_PORT=str(sim_port), **(sim_env or {}))
    for name in SERVICES:
        if name == "row-worker":
            for n in range(workers):
                system.add("row-worker" if n == 0 else f"row-worker#{n + 1}")
        else:
            system.add(name)
    return system


def offload_routes(sim_port: int, max_retries: int) -> str:
    """Aliases led by the simulator's batch APIs at half the realtime price, each with a
    priced realtime fallback: ``sim-half`` (OpenAI Batch, then ``sim-priced``) and
    ``sim-claude-half`` (Message Batches, then ``sim-claude-priced``). Rows are gathered
    for a second and polled every half second. ``sim-held-half`` gathers exactly 10 rows
    per provider batch and ``sim-pair-half`` exactly 50 (their linger is an hour: a
    provider batch holds every row a test meant to put in it, however slow the run).
    ``sim-endpoints-half`` runs every endpoint through OpenAI Batch, then ``sim``."""
    base = f'base_url = "http://127.0.0.1:{sim_port}/v1"\n'
    realtime = f"timeout_s = 30\nmax_retries = {max_retries}\n"
    batch = "timeout_s = 30\nlinger_s = 1\npoll_s = 0.5\n"
    half = "price = { prompt_per_mtok = 500.0, completion_per_mtok = 1000.0 }\n"
    full = "price = { prompt_per_mtok = 1000.0, completion_per_mtok = 2000.0 }\n"
    claude = 'headers = { "x-api-key" = "sim" }\n'
    return (
        '\n[aliases.sim-half]\ndeployments = ["sim-openai-batch", "sim-priced"]\n\n'
        '[aliases.sim-claude-half]\ndeployments = ["sim-anthropic-batch", "sim-claude-priced"]\n\n'
        f'[deployments.sim-openai-batch]\nprovider = "openai-batch"\n{base}'
        f'model = "sim-echo"\n{batch}{half}\n'
        f'[deployments.sim-anthropic-batch]\nprovider = "anthropic-batch"\n{base}'
        f'model = "sim-claude"\n{batch}{half}{claude}\n'
        '[aliases.sim-held-half]\ndeployments = ["sim-held-batch", "sim-priced"]\n\n'
        f'[deployments.sim-held-batch]\nprovider = "openai-batch"\n{base}'
        f'model = "sim-echo"\ntimeout_s = 30\nlinger_s = 3600\nmax_rows = 10\npoll_s = 0.5\n'
        f"{half}\n"
        '[aliases.sim-pair-half]\ndeployments = ["sim-pair-batch", "sim-priced"]\n\n'
        f'[deployments.sim-pair-batch]\nprovider = "openai-batch"\n{base}'
        f'model = "sim-echo"\ntimeout_s = 30\nlinger_s = 3600\nmax_rows = 50\npoll_s = 0.5\n'
        f"{half}\n"
        f'[deployments.sim-claude-priced]\nprovider = "anthropic"\n{base}'
        f'model = "sim-claude"\n{realtime}{full}{claude}\n'
        # Every endpoint through OpenAI's Batch API, the realtime "sim" behind it.
        '[aliases.sim-endpoints-half]\ndeployments = ["sim-endpoints-batch", "sim"]\n\n'
        f'[deployments.sim-endpoints-batch]\nprovider = "openai-batch"\n{base}'
        f'model = "sim-echo"\n{batch}{half}'
        + f"endpoints = {list(ALL_ENDPOINTS)!r}\n".replace("'", '"')
        + lanes_routes(sim_port, max_retries)
    )


def lanes_routes(sim_port: int, max_retries: int) -> str:
    """``sim-lanes``: the three lanes on the simulator, one model so a row's answers are
    counted together whatever the lane: a provider batch (half price, expected in 10 s),
    flex (half price, 20 rows a second declared) and realtime (full price, 40 a second)."""
    base = f'base_url = "http://127.0.0.1:{sim_port}/v1"\nmodel = "sim-echo"\n'
    half = "price = { prompt_per_mtok = 500.0, completion_per_mtok = 1000.0 }\n"
    full = "price = { prompt_per_mtok = 1000.0, completion_per_mtok = 2000.0 }\n"
    realtime = f"timeout_s = 30\nmax_retries = {max_retries}\n"
    return (
        '\n[aliases.sim-lanes]\ndeployments = ["sim-lanes-batch", "sim-flex", "sim-rt"]\n\n'
        f'[deployments.sim-lanes-batch]\nprovider = "openai-batch"\n{base}'
        f'timeout_s = 30\nlinger_s = 0.5\npoll_s = 0.3\nturnaround = "10s"\n{half}\n'
        f'[deployments.sim-flex]\nprovider = "openai"\n{base}{realtime}'
        f'service_tier = "flex"\nrows_per_s = 20\n{half}\n'
        f'[deployments.sim-rt]\nprovider = "openai"\n{base}{realtime}rows_per_s = 40\n{full}'
    )


async def sim_stats(http: aiohttp.ClientSession, system: System) -> dict[str, int]:
    """The simulator's counters (``calls``, ``batches_created``, ``batch_rows``, …)."""
    async with http.get(f"{system.sim_url}/stats") as response:
        return dict(await response.json())


async def sim_answers(http: aiohttp.ClientSession, system: System) -> dict[str, object]:
    """The simulator's calls answered per distinct request (``extra_answers``: answers
    paid for a request already answered; ``rows_answered_twice``, ``extra_begun``, …)."""
    async with http.get(f"{system.sim_url}/stats/answers") as response:
        return dict(await response.json())


async def sim_calls(http: aiohttp.ClientSession, system: System) -> int:
    """How many chat completion calls the simulator has received so far."""
    async with http.get(f"{system.sim_url}/stats") as response:
        return int((await response.json())["calls"])


def _remove_logs(log_dir: Path) -> None:
    for old in log_dir.glob("*.log"):
        old.unlink()


@contextlib.asynccontextmanager
async def running_system(
    tag: str,
    log_dir: Path,
    http: aiohttp.ClientSession,
    *,
    fresh_logs: bool = False,
    **options: object,
) -> AsyncIterator[System]:
    """A fresh isolation with every service of :func:`build_system` (``options``) running
    on it; on leaving, every process is stopped (each must exit 0) and the isolation is
    dropped. ``fresh_logs`` first removes the logs of an earlier run in ``log_dir``."""
    iso = await create_isolation(tag)
    if fresh_logs:
        _remove_logs(log_dir)
    system = build_system(iso, log_dir, **options)  # type: ignore[arg-type]
    try:
        await system.start_all(http)
        yield system
    finally:
        codes = system.stop_all()
        await drop_isolation(iso)
    assert all(code == 0 for code in codes.values()), f"unclean exits: {codes}"


def system_fixture(tag: str, *, fresh_logs: bool = False, **options: object) -> Any:
    """A module-scoped fixture: a :func:`running_system` tagged ``tag`` with ``options``,
    its logs in ``e2e-<tag>`` of the output folder; the module names it by assignment."""

    async def fixture(output_dir: Path, http: aiohttp.ClientSession) -> AsyncIterator[System]:
        log_dir = output_dir / f"e2e-{tag}"
        async with running_system(tag, log_dir, http, fresh_logs=fresh_logs, **options) as system:
            yield system

    return pytest.fixture(scope="module")(fixture)


async def signed_in(system: System, http: aiohttp.ClientSession, workspace: str) -> ApiClient:
    """A client of ``system``'s API signed in to ``workspace`` (created on first use)."""
    created = await admin.create_key(system.iso.database_url, workspace)
    return ApiClient(system.api_url, created.key, http)
