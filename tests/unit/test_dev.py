"""What ``relay dev`` starts and on which ports: its settings, health ports, routes."""

from __future__ import annotations

import socket
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from relay_batches.router.aliases import load_aliases
from relay_batches.services.relay_dev.dev import (
    LOCAL_ROUTES,
    DevOptions,
    dev_children,
    health_names,
    health_ports,
    limit_lines,
    listen_port,
    routes_file_for,
    with_limits,
)
from relay_batches.services.relay_dev.ports import HealthPort, is_free
from relay_batches.settings import ConfigError, Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def held() -> Iterator[int]:
    """A loopback port another program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _consecutive_free(count: int) -> int:
    """The first of ``count`` free consecutive ports below Linux's ephemeral range, where
    the machine's outgoing connections do not take ports at random."""
    for first in range(23000, 24000, 10):
        if all(is_free("127.0.0.1", port) for port in range(first, first + count)):
            return first
    raise AssertionError("no free consecutive ports in 23000..23999")


@pytest.fixture(autouse=True)
def _at_the_repository_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def test_the_defaults_start_one_row_worker_and_the_simulator_on_8090() -> None:
    assert DevOptions.from_env({}) == DevOptions(1, "127.0.0.1", 8090, None, None)
    options = DevOptions.from_env({"RELAY_DEV_ROW_WORKERS": "3", "RELAY_SIM_PORT": "9000"})
    assert (options.row_workers, options.sim_port) == (3, 9000)


@pytest.mark.parametrize("raw", ["0", "33", "two", "-1", "1.5"])
def test_a_bad_row_worker_count_is_one_line_naming_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError) as caught:
        DevOptions.from_env({"RELAY_DEV_ROW_WORKERS": raw})
    assert str(caught.value) == (
        f"RELAY_DEV_ROW_WORKERS must be a whole number from 1 to 32, got {raw!r}"
    )


def test_several_row_workers_are_numbered() -> None:
    assert health_names(1) == [
        "ingest-api",
        "scheduler",
        "dispatcher",
        "row-worker",
        "aggregator",
        "notifier",
        "offloader",
    ]
    assert health_names(2)[3:5] == ["row-worker-1", "row-worker-2"]


def test_free_health_ports_are_distinct_and_avoid_the_api_and_simulator_ports() -> None:
    api, sim = listen_port("127.0.0.1", 0, "RELAY_API_PORT"), 0
    ports = health_ports(Settings(), health_names(3), {api, sim})
    numbers = [p.port for p in ports]
    assert len(set(numbers)) == 9 and api not in numbers
    assert not any(p.fixed for p in ports)


def test_a_fixed_health_port_gives_consecutive_ports_and_names_a_taken_one(held: int) -> None:
    with pytest.raises(ConfigError, match=rf"ingest-api would listen on 127\.0\.0\.1:{held},"):
        health_ports(Settings(health_port=held), health_names(1), set())
    first = _consecutive_free(2)
    ports = health_ports(Settings(health_port=first), ["a", "b"], set())
    assert [(p.port, p.fixed) for p in ports] == [(first, True), (first + 1, True)]


def test_a_taken_api_port_stops_relay_dev_with_one_line(held: int) -> None:
    with pytest.raises(ConfigError) as caught:
        listen_port("127.0.0.1", held, "RELAY_API_PORT")
    assert str(caught.value) == (
        f"RELAY_API_PORT={held}: 127.0.0.1:{held} is already in use (another make run?); "
        "set RELAY_API_PORT to a free port"
    )


def test_a_movable_health_port_moves_off_a_taken_port(held: int) -> None:
    movable = HealthPort("127.0.0.1", held)
    port, moved = movable.claim()
    assert moved and port != held and movable.url == f"http://127.0.0.1:{port}/readyz"
    assert HealthPort("127.0.0.1", held, fixed=True).claim() == (held, False)


def test_the_local_routes_follow_the_simulator(tmp_path: Path) -> None:
    assert routes_file_for(DevOptions(), "http://127.0.0.1:8090/v1", tmp_path) == LOCAL_ROUTES
    moved = routes_file_for(DevOptions(sim_port=9123), "http://127.0.0.1:9123/v1", tmp_path)
    (deployment,) = load_aliases(moved, {}).resolve("gpt-4o-mini") or ()
    assert deployment.base_url == "http://127.0.0.1:9123/v1"
    given = DevOptions(routes_file="mine.toml")
    assert routes_file_for(given, "http://127.0.0.1:9123/v1", tmp_path) == "mine.toml"


def test_every_child_gets_the_ports_and_routes_it_needs(tmp_path: Path) -> None:
    settings = Settings(api_port=0)
    children = dev_children(settings, DevOptions(row_workers=2, sim_port=0), {}, tmp_path)
    names = [c.name for c in children]
    assert names[:2] == ["upstream-sim", "ingest-api"] and len(names) == 9
    sim_port = children[0].env["RELAY_SIM_PORT"]
    assert children[0].where == f"simulator http://127.0.0.1:{sim_port}/v1"
    routes = children[0].env["RELAY_ROUTES_FILE"]
    (deployment,) = load_aliases(routes, {}).resolve("gpt-4o-mini") or ()
    assert deployment.base_url == f"http://127.0.0.1:{sim_port}/v1"
    assert all(c.env["RELAY_API_PORT"] == children[1].env["RELAY_API_PORT"] for c in children)
    assert [c.health is None for c in children] == [True] + [False] * 8
    api_port = children[1].env["RELAY_API_PORT"]
    assert children[1].where == f"API http://127.0.0.1:{api_port}"
    assert children[4].argv[0].endswith("/relay-row-worker")


def test_dev_rate_limits_are_read_from_relay_dev_rpm_and_tpm() -> None:
    assert DevOptions.from_env({}).limits == {}
    options = DevOptions.from_env({"RELAY_DEV_RPM": "600", "RELAY_DEV_TPM": " 60000 "})
    assert (options.rpm, options.tpm, options.limits) == (600, 60000, {"rpm": 600, "tpm": 60000})
    assert DevOptions.from_env({"RELAY_DEV_RPM": ""}).rpm is None


@pytest.mark.parametrize(
    ("variable", "raw", "most"),
    [
        ("RELAY_DEV_RPM", "0", "1_000_000_000"),
        ("RELAY_DEV_RPM", "ten", "1_000_000_000"),
        ("RELAY_DEV_RPM", "-5", "1_000_000_000"),
        ("RELAY_DEV_RPM", "1e3", "1_000_000_000"),
        ("RELAY_DEV_RPM", "1000000001", "1_000_000_000"),
        ("RELAY_DEV_TPM", "6.5", "1_000_000_000_000"),
    ],
)
def test_a_bad_dev_rate_limit_is_one_line_naming_the_variable(
    variable: str, raw: str, most: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        DevOptions.from_env({variable: raw})
    assert str(caught.value) == f"{variable} must be a whole number from 1 to {most}, got {raw!r}"


def test_limits_go_on_every_deployment_table_and_replace_its_own() -> None:
    text = (
        "# rpm = 5 in a comment stays\n"
        '[aliases.a]\ndeployments = ["one"]\nrpm = 7\n\n'
        '[deployments.one]\nmodel = "m"\nrpm = 5\n\n'
        '[deployments.two] # the second\nmodel = "n"\ntpm = 9\n'
    )
    rendered = with_limits(text, {"rpm": 600})
    parsed = tomllib.loads(rendered)
    assert parsed["deployments"] == {
        "one": {"model": "m", "rpm": 600},
        "two": {"model": "n", "tpm": 9, "rpm": 600},
    }
    assert parsed["aliases"]["a"]["rpm"] == 7  # not a deployment: untouched
    assert rendered.startswith("# rpm = 5 in a comment stays\n")
    assert with_limits(text, {}) == text


def test_the_local_routes_carry_the_dev_limits_on_every_deployment(tmp_path: Path) -> None:
    options = DevOptions(rpm=600, tpm=60000)
    routes = routes_file_for(options, "http://127.0.0.1:8090/v1", tmp_path)
    assert routes == str(tmp_path / "routes.toml")  # a copy, even at the local port
    with open(routes, "rb") as handle:
        deployments = tomllib.load(handle)["deployments"]
    assert {name: (d["rpm"], d["tpm"]) for name, d in deployments.items()} == {
        "local-sim": (600, 60000),
        "local-sim-claude": (600, 60000),
    }
    (deployment,) = load_aliases(routes, {}).resolve("gpt-4o-mini") or ()
    assert deployment.base_url == "http://127.0.0.1:8090/v1"
    moved = routes_file_for(DevOptions(sim_port=9123, rpm=60), "http://127.0.0.1:9123/v1", tmp_path)
    (deployment,) = load_aliases(moved, {}).resolve("gpt-4o-mini") or ()
    assert deployment.base_url == "http://127.0.0.1:9123/v1"
    assert "rpm = 60\n" in Path(moved).read_text()


def test_only_the_simulator_gets_the_dev_limits_and_relay_dev_says_so(tmp_path: Path) -> None:
    options = DevOptions(sim_port=0, rpm=600)
    children = dev_children(Settings(api_port=0), options, {}, tmp_path)
    assert children[0].env["RELAY_SIM_RPM"] == "600"
    assert "RELAY_SIM_TPM" not in children[0].env
    assert not any("RELAY_SIM_RPM" in c.env for c in children[1:])
    routes = children[1].env["RELAY_ROUTES_FILE"]
    assert limit_lines(options, routes) == [
        "rate limit 600 rpm: the simulator enforces it (429 above it, GET /stats), and "
        "deployments local-sim, local-sim-claude of the routes carry it",
        "watch relay_ratelimit_* on each row-worker's /metrics (its health port)",
    ]
    assert limit_lines(DevOptions(), routes) == []
    mine = DevOptions(routes_file="mine.toml", tpm=6000)
    assert limit_lines(mine, "mine.toml") == [
        "rate limit 6000 tpm: the simulator enforces it (429 above it, GET /stats); "
        "RELAY_ROUTES_FILE is used as it is (put rpm/tpm in it)"
    ]


def test_dev_limits_leave_a_batch_deployment_alone() -> None:
    text = (
        '[aliases.half]\ndeployments = ["b", "r"]\n\n'
        '[deployments.b]\nprovider = "openai-batch"\nbase_url = "http://127.0.0.1:1/v1"\n'
        'model = "m"\n\n'
        '[deployments.r]\nprovider = "openai"\nbase_url = "http://127.0.0.1:1/v1"\n'
        'model = "m"\n'
    )
    limited = tomllib.loads(with_limits(text, {"rpm": 600}))["deployments"]
    assert ("rpm" in limited["b"], limited["r"]["rpm"]) == (False, 600)
