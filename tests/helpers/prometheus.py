"""A real Prometheus (Debian's ``prometheus`` binary) scraping a running system, for the
e2e tests: its own free port and a temporary data folder, a 1 s scrape and evaluation
interval, the rules of ``deploy/monitoring`` loaded with every ``for:`` shortened (the
shipped file is never changed), stopped and removed on leaving."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tests.helpers.processes import SERVICES, System
from tests.helpers.support import free_port, wait_until
from tests.monitoring.files import rules

BINARY = "/usr/bin/prometheus"
SCRAPE_S = 1


def templated_rules(for_: str) -> dict[str, Any]:
    """The shipped rules with every ``for:`` set to ``for_`` (alerts fire at once)."""
    templated = rules()
    for group in templated["groups"]:
        group["interval"] = f"{SCRAPE_S}s"
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = for_
    return templated


def scrape_config(system: System, rules_file: Path) -> dict[str, Any]:
    """One job per service, its health port, with the ``service`` label the rules use."""
    jobs = []
    for name in SERVICES:
        port = system.processes[name].health_port()
        assert port is not None, f"{name} has not logged its health port"
        jobs.append(
            {
                "job_name": f"relay-{name}",
                "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": {"service": name}}],
            }
        )
    return {
        "global": {
            "scrape_interval": f"{SCRAPE_S}s",
            "scrape_timeout": f"{SCRAPE_S}s",
            "evaluation_interval": f"{SCRAPE_S}s",
        },
        "rule_files": [str(rules_file)],
        "scrape_configs": jobs,
    }


@dataclass
class Prometheus:
    """A running Prometheus and its HTTP API."""

    url: str
    http: aiohttp.ClientSession

    async def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``; its ``data`` (the status must be success)."""
        async with self.http.get(
            f"{self.url}/api/v1/{path}", params=params, timeout=aiohttp.ClientTimeout(10)
        ) as response:
            body = await response.json()
        assert body["status"] == "success", body
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector."""
        data = await self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    async def scalar(self, expr: str) -> float | None:
        """The value of a one-element vector (None when empty)."""
        result = await self.query(expr)
        return float(result[0]["value"][1]) if result else None


@contextlib.asynccontextmanager
async def running_prometheus(
    system: System, http: aiohttp.ClientSession, log_dir: Path, *, for_: str = "0s"
) -> AsyncIterator[Prometheus]:
    """Prometheus scraping every service of ``system``; its log in ``log_dir``."""
    assert shutil.which(BINARY), "make prometheus installs it"
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="relay-prometheus-") as tmp:
        process = _start(system, Path(tmp), port, log_dir, for_)
        prometheus = Prometheus(f"http://127.0.0.1:{port}", http)
        try:
            await wait_until(lambda: _ready(prometheus, process), 30, "prometheus to be ready")
            yield prometheus
        finally:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def _start(
    system: System, folder: Path, port: int, log_dir: Path, for_: str
) -> subprocess.Popen[bytes]:
    """Write the rules and the configuration into ``folder`` and start Prometheus."""
    rules_file = folder / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(templated_rules(for_)))
    config = folder / "prometheus.yaml"
    config.write_text(yaml.safe_dump(scrape_config(system, rules_file)))
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "prometheus.log", "ab") as log:
        return subprocess.Popen(
            [
                BINARY,
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def _ready(prometheus: Prometheus, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"prometheus exited with {process.returncode}")
    try:
        async with prometheus.http.get(
            f"{prometheus.url}/-/ready", timeout=aiohttp.ClientTimeout(2)
        ) as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False
