"""deploy/compose.yaml: every service present with the right command and environment.

There is no Docker engine here, so the file is parsed (YAML anchors and merge keys
resolved as compose resolves them) and checked against the code it runs.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from relay_batches.router.aliases import load_aliases
from relay_batches.settings import Settings
from tests.deploy.manifests import (
    DEPLOY,
    RUNTIME_HARD_DEADLINE_S,
    SERVICES,
    console_scripts,
    load_yaml,
)

COMPOSE = DEPLOY / "compose.yaml"
INFRA = ("postgres", "rabbitmq", "migrate", "upstream-sim")


def _compose() -> dict:
    return dict(load_yaml(COMPOSE))


def _services() -> dict[str, dict]:
    return dict(_compose()["services"])


def _seconds(duration: str) -> float:
    assert duration.endswith("s") and not duration.endswith("ms"), duration
    return float(duration[:-1])


def _env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in _services()[service]["environment"].items()}


def test_every_service_and_the_infrastructure_are_there() -> None:
    assert set(_services()) == set(SERVICES) | set(INFRA)


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_runs_its_console_script_after_the_migration(service: str) -> None:
    spec = _services()[service]
    assert spec["command"] == [f"relay-{service}"]
    assert spec["command"][0] in console_scripts()
    assert spec["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert spec["depends_on"]["rabbitmq"] == {"condition": "service_healthy"}
    assert spec["image"] == _services()["migrate"]["image"]


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_reaches_the_compose_hosts_and_listens_outside_loopback(service: str) -> None:
    env = _env(service)
    settings = Settings.from_env(env)
    assert urlsplit(settings.database_url).hostname == "postgres"
    assert urlsplit(settings.amqp_url).hostname == "rabbitmq"
    assert settings.health_host == "0.0.0.0" and settings.health_port > 0
    assert settings.api_host == "0.0.0.0"
    port = settings.api_port if service == "ingest-api" else settings.health_port
    probe = " ".join(_services()[service]["healthcheck"]["test"])
    assert f"127.0.0.1:{port}/readyz" in probe


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_is_locked_down_and_drains_before_being_killed(service: str) -> None:
    spec = _services()[service]
    assert spec["read_only"] is True
    assert spec["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in spec["security_opt"]
    grace = Settings.from_env(_env(service)).shutdown_grace_s
    assert _seconds(spec["stop_grace_period"]) >= grace + RUNTIME_HARD_DEADLINE_S


def test_only_ingest_api_publishes_a_port_so_row_workers_can_be_scaled() -> None:
    published = {name for name, spec in _services().items() if spec.get("ports")}
    assert published == {"ingest-api", "rabbitmq"}
    assert _services()["ingest-api"]["ports"] == ["127.0.0.1:8080:8080"]


def test_rabbitmq_has_the_management_ui() -> None:
    rabbit = _services()["rabbitmq"]
    assert "management" in rabbit["image"]
    assert any(p.endswith(":15672") for p in rabbit["ports"])
    env = _env("row-worker")
    url = urlsplit(env["RELAY_AMQP_URL"])
    assert (url.username, url.password) == (
        rabbit["environment"]["RABBITMQ_DEFAULT_USER"],
        rabbit["environment"]["RABBITMQ_DEFAULT_PASS"],
    )


def test_the_migrate_step_runs_relay_migrate_on_a_healthy_postgres() -> None:
    migrate = _services()["migrate"]
    assert migrate["command"] == ["relay", "migrate"]
    assert "relay" in console_scripts()
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert migrate["restart"] == "no"
    assert (
        Settings.from_env(_env("migrate")).database_url == _env("row-worker")["RELAY_DATABASE_URL"]
    )


def test_the_image_builds_from_the_repository_root() -> None:
    build = _services()["migrate"]["build"]
    context = (COMPOSE.parent / build["context"]).resolve()
    assert (context / build["dockerfile"]).is_file()
    assert (context / "pyproject.toml").is_file()


def test_the_routes_file_points_at_the_simulator_service_by_name(tmp_path: Path) -> None:
    sim = _services()["upstream-sim"]
    assert sim["command"] == ["relay-upstream-sim"]
    # The Relay image carries no simulator: it runs from the Dockerfile's own stage.
    assert sim["build"]["target"] == "upstream-sim"
    assert sim["image"] != _services()["migrate"]["image"]
    assert sim["environment"]["RELAY_SIM_HOST"] == "0.0.0.0"
    for service in SERVICES:
        env = _env(service)
        (mount,) = _services()[service]["volumes"]
        source, target, mode = mount.split(":")
        assert (target, mode) == (env["RELAY_ROUTES_FILE"], "ro")
        routes_path = COMPOSE.parent / source
        assert routes_path.is_file()
    routes = load_aliases(str(routes_path), {})
    (deployment,) = routes.resolve("gpt-4o-mini") or ()
    url = urlsplit(deployment.base_url)
    assert url.hostname == "upstream-sim"
    assert url.port == int(sim["environment"]["RELAY_SIM_PORT"])
