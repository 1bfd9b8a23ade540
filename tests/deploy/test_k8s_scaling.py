"""Scaling and disruption: ingest-api on CPU, row-workers on the real backlog (KEDA on the
ledger's unfinished rows, or the HPA component on the rows queue's ready and unacknowledged
messages), and a PodDisruptionBudget per service."""

from __future__ import annotations

import copy

import pytest

from relay_batches.bus.topology import Names, rows_prefetch
from tests.deploy.keda_checks import scaled_object_problems, trigger_auth_problems
from tests.deploy.manifests import (
    MIN_K8S,
    OVERLAYS,
    ROOT,
    SERVICES,
    Rendered,
    backlog_query,
    containers,
    env_sources,
    pod_labels,
    render,
    selector_matches,
)

AUTOSCALED = ("ingest-api", "row-worker")
# The postgresql scaler's parameters and the relay-connections keys that carry them: the
# fields of RELAY_DATABASE_URL's database (or of a read-only role on batches).
LEDGER_FIELDS = {
    "host": "ledger-host",
    "port": "ledger-port",
    "userName": "ledger-user",
    "password": "ledger-password",
    "dbName": "ledger-dbname",
    "sslmode": "ledger-sslmode",
}


def _rows_queue(rendered: Rendered) -> str:
    """The rows queue name the services compute from the rendered settings."""
    return Names(rendered.settings().namespace).rows


def _keda_problems(rendered: Rendered, scaled: dict) -> list[str]:
    return scaled_object_problems(
        scaled,
        rendered.names("Deployment"),
        rendered.names("TriggerAuthentication"),
        MIN_K8S,
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ingest_api_scales_on_cpu(overlay: str) -> None:
    rendered = render(overlay)
    (hpa,) = rendered.of_kind("HorizontalPodAutoscaler")
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "ingest-api",
    }
    assert 1 <= spec["minReplicas"] <= spec["maxReplicas"]
    (metric,) = spec["metrics"]
    assert metric["type"] == "Resource"
    assert metric["resource"]["name"] == "cpu"
    (container,) = containers(rendered.get("Deployment", "ingest-api"))
    assert container["resources"]["requests"]["cpu"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_autoscaled_deployments_leave_replicas_to_the_autoscaler(overlay: str) -> None:
    rendered = render(overlay)
    for name in AUTOSCALED:
        assert "replicas" not in rendered.get("Deployment", name)["spec"], name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_has_a_disruption_budget_selecting_only_its_pods(overlay: str) -> None:
    rendered = render(overlay)
    deployments = rendered.of_kind("Deployment")
    for service in SERVICES:
        budget = rendered.get("PodDisruptionBudget", service)
        selector = budget["spec"]["selector"]["matchLabels"]
        matched = [
            d["metadata"]["name"] for d in deployments if selector_matches(selector, pod_labels(d))
        ]
        assert matched == [service]
        assert ("maxUnavailable" in budget["spec"]) != ("minAvailable" in budget["spec"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_scales_row_workers_on_the_ledgers_unfinished_rows(overlay: str) -> None:
    rendered = render(overlay)
    scaled = rendered.get("ScaledObject", "row-worker")
    assert _keda_problems(rendered, scaled) == []
    assert scaled["spec"]["scaleTargetRef"]["name"] == "row-worker"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    assert trigger["metadata"]["query"] == backlog_query()
    # One replica per RELAY_BATCH_CONCURRENCY unfinished rows: the rows it works at once.
    settings = rendered.settings()
    assert trigger["metadata"]["targetQueryValue"] == str(settings.batch_concurrency)
    assert settings.batch_concurrency == {"dev": 4, "prod": 8}[overlay]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_reads_the_ledgers_connection_fields_from_the_services_secret(overlay: str) -> None:
    rendered = render(overlay)
    scaled = rendered.get("ScaledObject", "row-worker")
    auth_name = scaled["spec"]["triggers"][0]["authenticationRef"]["name"]
    auth = rendered.get("TriggerAuthentication", auth_name)
    assert trigger_auth_problems(auth, "postgresql") == []
    (worker,) = containers(rendered.get("Deployment", "row-worker"))
    ledger = dict(env_sources(worker))["RELAY_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert {(r["parameter"], r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]} == {
        (parameter, ledger["name"], key) for parameter, key in LEDGER_FIELDS.items()
    }


def test_the_keda_checks_catch_a_wrong_queue_target_and_field() -> None:
    rendered = render("prod")
    good = rendered.get("ScaledObject", "row-worker")
    cases = {
        "scaleTargetRef": ("scaleTargetRef", {"name": "no-such-deployment"}),
        "unknown spec field": ("minReplicas", 1),
        "replica range": ("maxReplicaCount", 0),
    }
    for expected, (field, value) in cases.items():
        broken = copy.deepcopy(good)
        broken["spec"][field] = value
        assert any(expected in p for p in _keda_problems(rendered, broken)), expected
    metadata_cases = {
        "qurey": ("qurey", "SELECT 1"),
        "no query": ("query", "DELETE FROM batches"),
        "targetQueryValue": ("targetQueryValue", "0"),
        "must be strings": ("targetQueryValue", 8),
    }
    for expected, (field, value) in metadata_cases.items():
        broken = copy.deepcopy(good)
        broken["spec"]["triggers"][0]["metadata"][field] = value
        assert any(expected in p for p in _keda_problems(rendered, broken)), expected
    broken = copy.deepcopy(good)
    broken["spec"]["triggers"][0]["authenticationRef"]["name"] = "relay-rabbitmq"
    assert any("no connection" in p for p in _keda_problems(rendered, broken))
    broken = copy.deepcopy(good)
    broken["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
        "stabilisation"
    ] = 1
    assert any("behavior" in p for p in _keda_problems(rendered, broken))
    auth = copy.deepcopy(rendered.get("TriggerAuthentication", "relay-postgres"))
    auth["spec"]["secretTargetRef"][0]["parameter"] = "connection"
    assert trigger_auth_problems(auth, "postgresql") == [
        "no secretTargetRef for the postgresql 'host' parameter",
        "the postgresql 'connection' parameter shares one KEDA pool",
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_hpa_component_replaces_keda_with_the_rows_queues_whole_depth(
    overlay: str,
) -> None:
    rendered = render(overlay, hpa_component=True)
    assert rendered.of_kind("ScaledObject") == []
    assert rendered.of_kind("TriggerAuthentication") == []
    hpa = rendered.get("HorizontalPodAutoscaler", "row-worker")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "row-worker"
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    # Ready and unacknowledged: the ready ones alone miss every slice a worker holds.
    assert metric["external"]["metric"]["name"] == "rabbitmq_queue_messages"
    selector = metric["external"]["metric"]["selector"]["matchLabels"]
    assert selector == {"queue": _rows_queue(rendered)}
    # One replica per slices it holds at once (its prefetch).
    settings = rendered.settings()
    target = metric["external"]["target"]
    assert target == {
        "type": "AverageValue",
        "averageValue": str(rows_prefetch(settings.batch_concurrency, settings.slice_rows)),
    }
    assert rendered.get("HorizontalPodAutoscaler", "ingest-api")


def test_the_deployment_page_creates_every_secret_key_keda_reads() -> None:
    page = (ROOT / "docs" / "operations" / "deployment.md").read_text(encoding="utf-8")
    created = page.split("create secret generic relay-connections", 1)[1].split("\n\n", 1)[0]
    auth = render("prod").get("TriggerAuthentication", "relay-postgres")
    for ref in auth["spec"]["secretTargetRef"]:
        assert f"--from-literal={ref['key']}=" in created, ref["key"]
    # KEDA's operator resolves a short host in its own namespace, and keys the pool it
    # shares across the cluster by user, host and database: the example host is a FQDN.
    host = created.split("--from-literal=ledger-host=", 1)[1].split()[0]
    assert host.endswith(".svc.cluster.local"), host
