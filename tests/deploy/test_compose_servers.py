"""deploy/compose.servers.yaml: the quickstart's one command for Postgres and RabbitMQ on a
laptop publishes them where the settings' defaults (and so `make run`) look for them."""

from __future__ import annotations

from urllib.parse import urlsplit

from relay_batches.settings import Settings
from tests.deploy.manifests import DEPLOY, ROOT, load_yaml

SERVERS = DEPLOY / "compose.servers.yaml"
QUICKSTART = ROOT / "docs" / "quickstart.md"


def _services() -> dict[str, dict]:
    return dict(load_yaml(SERVERS)["services"])


def _published(service: str) -> set[tuple[str, int]]:
    """(host address, container port) of each port the service publishes."""
    ports = set()
    for spec in _services()[service]["ports"]:
        host, host_port, port = str(spec).split(":")
        assert host_port == port, spec
        ports.add((host, int(port)))
    return ports


def test_only_the_two_servers_on_the_loopback_ports_of_the_default_urls() -> None:
    assert set(_services()) == {"postgres", "rabbitmq"}
    defaults = Settings.from_env({})
    database = urlsplit(defaults.database_url)
    amqp = urlsplit(defaults.amqp_url)
    assert (database.hostname, database.port) in _published("postgres")
    assert (amqp.hostname, amqp.port) in _published("rabbitmq")
    # The default URLs' credentials: Postgres trusts user postgres, RabbitMQ keeps guest.
    assert database.username == "postgres"
    assert _services()["postgres"]["environment"] == {"POSTGRES_HOST_AUTH_METHOD": "trust"}
    assert (amqp.username, amqp.password) == ("guest", "guest")
    assert "environment" not in _services()["rabbitmq"]


def test_the_same_images_as_the_full_compose_file() -> None:
    full = dict(load_yaml(DEPLOY / "compose.yaml")["services"])
    for name, spec in _services().items():
        assert spec["image"] == full[name]["image"], name


def test_the_quickstart_gives_the_command() -> None:
    command = "docker compose -f deploy/compose.servers.yaml up -d"
    assert command in QUICKSTART.read_text(encoding="utf-8")
