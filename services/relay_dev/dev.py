"""``relay dev`` (``make run``): the upstream simulator and every service on this machine.

The settings only ``relay dev`` has are read here, from the environment ``__main__``
passes in: ``RELAY_DEV_ROW_WORKERS``, ``RELAY_DEV_API_KEY``, ``RELAY_DEV_KEY_FILE``, the
simulator's ``RELAY_SIM_HOST`` / ``RELAY_SIM_PORT`` (the local routes file follows the
simulator) and ``RELAY_DEV_RPM`` / ``RELAY_DEV_TPM`` (a rate limit the simulator
enforces and every deployment of the local routes carries, so the shared limiter has one
to hold). The API and simulator ports must be free; every service gets a health port of
its own (free ones, or consecutive ones from ``RELAY_HEALTH_PORT``), so two ``make run``
on one machine, or a machine with some ports taken, still start.
"""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import tempfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from relay_batches.router.aliases import BATCH_PROVIDERS
from relay_batches.services.relay_cli import admin
from relay_batches.services.relay_dev.console import check_broker, dev_key, ready_line, wait_ready
from relay_batches.services.relay_dev.ports import HealthPort, free_ports, is_free, url_host
from relay_batches.services.relay_dev.supervisor import Child, say, supervise
from relay_batches.settings import ConfigError, DevSettings, Settings, SimSettings
from relay_batches.settings.declare import read_one

DEV_WORKSPACE = "dev"
SIM_MODULE = "relay_batches.services.upstream_sim"
DEV_WEBHOOK_ALLOW = "127.0.0.0/8,::1/128"
LOCAL_ROUTES = Settings().routes_file
LOCAL_SIM_URL = "http://127.0.0.1:8090/v1"
DEFAULT_SIM_PORT = SimSettings.port
_TABLE = re.compile(r"^\s*\[([^\]]*)\]\s*(?:#.*)?$")
_LIMIT_KEY = re.compile(r"^\s*(rpm|tpm)\s*=")


@dataclass(frozen=True)
class DevOptions:
    """What ``relay dev`` reads besides :class:`Settings`; ``routes_file`` is None when the
    user gave none (the local routes file, pointed at the simulator, are used)."""

    row_workers: int = 1
    sim_host: str = "127.0.0.1"
    sim_port: int = DEFAULT_SIM_PORT
    api_key: str | None = None
    routes_file: str | None = None
    rpm: int | None = None
    tpm: int | None = None
    key_file: str = DevSettings.key_file
    verbose: bool = False

    @property
    def limits(self) -> dict[str, int]:
        """The rate-limit keys to put on every local deployment (``rpm``, ``tpm``)."""
        given = {"rpm": self.rpm, "tpm": self.tpm}
        return {key: value for key, value in given.items() if value is not None}

    @classmethod
    def from_env(cls, env: Mapping[str, str], verbose: bool = False) -> DevOptions:
        """Read the variables (``verbose``: ``relay dev --verbose``); raise
        :class:`ConfigError` on a bad value."""
        dev = DevSettings.from_env(env)
        return cls(
            row_workers=dev.row_workers,
            sim_host=read_one(SimSettings, "host", env, SimSettings.host),
            sim_port=read_one(SimSettings, "port", env, SimSettings.port),
            api_key=dev.api_key,
            routes_file=read_one(Settings, "routes_file", env),
            rpm=dev.rpm,
            tpm=dev.tpm,
            key_file=dev.key_file,
            verbose=verbose,
        )


def health_names(row_workers: int) -> list[str]:
    """The children with a health port (every one but the simulator), in start order;
    row-workers numbered when several."""
    workers = (
        ["row-worker"]
        if row_workers == 1
        else [f"row-worker-{n}" for n in range(1, row_workers + 1)]
    )
    return [
        "ingest-api",
        "scheduler",
        "dispatcher",
        *workers,
        "aggregator",
        "notifier",
        "offloader",
    ]


def listen_port(host: str, port: int, variable: str, avoid: Mapping[int, str] | None = None) -> int:
    """The port of a listener the user names: 0 picks a free one; a taken one stops us, and
    so does one already given to another listener (``avoid``: port → its variable)."""
    avoid = avoid or {}
    if port == 0:
        return next(p for p in free_ports(host, len(avoid) + 1) if p not in avoid)
    if port in avoid:
        raise ConfigError(f"{variable}={port} is also {avoid[port]}: give each its own port")
    if not is_free(host, port):
        raise ConfigError(
            f"{variable}={port}: {host}:{port} is already in use (another make run?); "
            f"set {variable} to a free port"
        )
    return port


def health_ports(settings: Settings, names: list[str], taken: set[int]) -> list[HealthPort]:
    """One health port per name: free ones (avoiding ``taken``), or, when
    ``RELAY_HEALTH_PORT`` is set, consecutive ones from it that must all be free."""
    host, first = settings.health_host, settings.health_port
    if first == 0:
        ports = [p for p in free_ports(host, len(names) + len(taken)) if p not in taken]
        return [HealthPort(host, port) for port in ports[: len(names)]]
    if first + len(names) - 1 > 65535:
        raise ConfigError(f"RELAY_HEALTH_PORT={first}: {len(names)} ports from it pass 65535")
    for name, port in zip(names, range(first, first + len(names)), strict=True):
        if port in taken or not is_free(host, port):
            raise ConfigError(
                f"RELAY_HEALTH_PORT={first}: {name} would listen on {host}:{port}, which is "
                "taken (unset RELAY_HEALTH_PORT to get free ports)"
            )
    return [HealthPort(host, port, fixed=True) for port in range(first, first + len(names))]


def with_limits(text: str, limits: Mapping[str, int]) -> str:
    """Routes text with ``limits`` (``{"rpm": 600}``) as keys of every realtime
    ``[deployments.*]`` table, right under its header, in place of any the table had (a
    batch deployment takes no rate limit)."""
    if not limits:
        return text
    batch = {f"deployments.{name}" for name in _batch_deployments(text)}
    lines: list[str] = []
    in_deployment = False
    for line in text.splitlines(keepends=True):
        table = _TABLE.match(line)
        if table:
            name = table[1].strip()
            in_deployment = name.startswith("deployments.") and name not in batch
            lines.append(line if line.endswith("\n") else line + "\n")
            if in_deployment:
                lines += [f"{key} = {value}\n" for key, value in limits.items()]
            continue
        limit_key = _LIMIT_KEY.match(line)
        if not (in_deployment and limit_key and limit_key[1] in limits):
            lines.append(line)
    return "".join(lines)


def _batch_deployments(text: str) -> set[str]:
    """The batch deployments (``openai-batch``, ``anthropic-batch``) of routes ``text``."""
    deployments = tomllib.loads(text).get("deployments", {})
    return {
        name
        for name, spec in deployments.items()
        if isinstance(spec, dict) and spec.get("provider") in BATCH_PROVIDERS
    }


def deployment_names(routes_file: str) -> list[str]:
    """The realtime deployments a routes file defines (it is valid TOML: relay dev wrote
    it), those a dev rate limit applies to."""
    with open(routes_file, encoding="utf-8") as handle:
        text = handle.read()
    batch = _batch_deployments(text)
    return sorted(name for name in tomllib.loads(text).get("deployments", {}) if name not in batch)


def routes_file_for(options: DevOptions, sim_url: str, directory: Path) -> str:
    """The routes file: the user's (as it is), else the local one pointed at ``sim_url``
    with ``options.limits`` on every deployment (a copy in ``directory`` when the
    simulator is not where the local file expects it, or when there are limits)."""
    if options.routes_file is not None:
        return options.routes_file
    local = Path(LOCAL_ROUTES)
    if not local.is_file():
        raise ConfigError(
            f"{LOCAL_ROUTES} not found: run relay dev from the repository root "
            "or set RELAY_ROUTES_FILE"
        )
    if sim_url == LOCAL_SIM_URL and not options.limits:
        return LOCAL_ROUTES
    text = local.read_text()
    if sim_url != LOCAL_SIM_URL and LOCAL_SIM_URL not in text:
        raise ConfigError(
            f"{LOCAL_ROUTES} does not name {LOCAL_SIM_URL}, so it cannot follow the "
            f"simulator to {sim_url}: set RELAY_ROUTES_FILE"
        )
    copy = directory / "routes.toml"
    copy.write_text(with_limits(text.replace(LOCAL_SIM_URL, sim_url), options.limits))
    return str(copy)


def sim_limits(options: DevOptions) -> dict[str, str]:
    """The simulator's environment for ``options.limits`` (``RELAY_SIM_RPM``, ``…_TPM``)."""
    return {f"RELAY_SIM_{key.upper()}": str(value) for key, value in options.limits.items()}


def limit_lines(options: DevOptions, routes_file: str) -> list[str]:
    """What ``relay dev`` says about ``RELAY_DEV_RPM`` / ``RELAY_DEV_TPM`` (nothing unset)."""
    if not options.limits:
        return []
    given = ", ".join(f"{value} {key}" for key, value in options.limits.items())
    first = f"rate limit {given}: the simulator enforces it (429 above it, GET /stats)"
    if options.routes_file is not None:
        return [f"{first}; RELAY_ROUTES_FILE is used as it is (put rpm/tpm in it)"]
    names = ", ".join(deployment_names(routes_file))
    return [
        f"{first}, and deployments {names} of the routes carry it",
        "watch relay_ratelimit_* on each row-worker's /metrics (its health port)",
    ]


def dev_children(
    settings: Settings, options: DevOptions, environ: Mapping[str, str], directory: Path
) -> list[Child]:
    """The simulator, ingest-api and every other service with its own health port."""
    api_port = listen_port(settings.api_host, settings.api_port, "RELAY_API_PORT")
    sim_port = listen_port(
        options.sim_host, options.sim_port, "RELAY_SIM_PORT", {api_port: "RELAY_API_PORT"}
    )
    sim_url = f"http://{url_host(options.sim_host)}:{sim_port}/v1"
    names = health_names(options.row_workers)
    ports = health_ports(settings, names, {api_port, sim_port})
    env = {
        **environ,
        "RELAY_ROUTES_FILE": routes_file_for(options, sim_url, directory),
        "RELAY_API_PORT": str(api_port),
        "RELAY_SIM_PORT": str(sim_port),
    }
    env.setdefault("RELAY_WEBHOOK_ALLOW_NETWORKS", DEV_WEBHOOK_ALLOW)
    if not options.verbose:
        env.setdefault("RELAY_LOG_SETTINGS", "none")  # the settings only with --verbose
    bindir = Path(sys.executable).parent

    def cmd(name: str) -> list[str]:
        if name == "upstream-sim":  # dev-only: a module of the source tree, no console script
            return [sys.executable, "-m", SIM_MODULE]
        script = "row-worker" if name.startswith("row-worker") else name
        return [str(bindir / f"relay-{script}")]

    api_url = f"http://{url_host(settings.api_host)}:{api_port}"
    where = {"ingest-api": f"API {api_url}"}
    sim_env = {**env, **sim_limits(options)}
    children = [Child("upstream-sim", cmd("upstream-sim"), sim_env, where=f"simulator {sim_url}")]
    children += [
        Child(name, cmd(name), dict(env), health=port, where=where.get(name, ""))
        for name, port in zip(names, ports, strict=True)
    ]
    return children


async def run(settings: Settings, options: DevOptions, environ: Mapping[str, str]) -> None:
    """Migrate, check the broker, get the dev key (:func:`.console.dev_key`), start
    everything, say one ready line once every service answers, and stop it all on
    SIGINT/SIGTERM. Postgres or RabbitMQ out of reach: :class:`~relay_batches.reach.
    Unreachable` before any service starts."""
    with tempfile.TemporaryDirectory(prefix="relay-dev-") as directory:
        children = dev_children(settings, options, environ, Path(directory))
        await admin.migrate(settings.database_url)
        await check_broker(settings.amqp_url)
        key = await dev_key(
            settings.database_url, DEV_WORKSPACE, options.api_key, Path(options.key_file)
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        env = children[1].env
        api = f"http://{url_host(settings.api_host)}:{env['RELAY_API_PORT']}"
        say(f"API on {api}  (Ctrl-C stops everything)")
        say(f"{options.row_workers} row-worker(s) (RELAY_DEV_ROW_WORKERS)")
        for line in limit_lines(options, env["RELAY_ROUTES_FILE"]):
            say(line)
        allowed = env["RELAY_WEBHOOK_ALLOW_NETWORKS"]
        say(f"webhooks may go to {allowed} in dev (RELAY_WEBHOOK_ALLOW_NETWORKS)")
        if options.api_key is None:
            say(f"dev key kept in {options.key_file} (RELAY_DEV_API_KEY overrides it)")
        if not options.verbose:
            say("services log without their settings (relay dev --verbose shows them)")
        announce = asyncio.create_task(_announce(children, api, key, stop), name="ready-line")
        try:
            await supervise(children, stop)
        finally:
            announce.cancel()
            await asyncio.gather(announce, return_exceptions=True)
    say("stopped")


async def _announce(children: list[Child], api: str, key: str, stop: asyncio.Event) -> None:
    """Say :func:`.console.ready_line` once the API and every health port answer 200."""
    urls = [f"{api}/readyz", *(c.health.url for c in children if c.health is not None)]
    if await wait_ready(urls, stop):
        say(ready_line(api, key))
