"""The monitoring and network-policies components on both overlays: the PodMonitor scrapes
every service's health port, the PrometheusRule carries the rules file, and each
service's NetworkPolicy lets through exactly the servers its pod is configured to reach;
plus the dashboard's shape and series (promtool's checks are `make monitoring-check`)."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.deploy.manifests import K8S, MIN_K8S, OVERLAYS, SERVICES, Resource, kustomize
from tests.monitoring.check import expected_prometheus_rule
from tests.monitoring.files import dashboard, dashboard_expressions, unknown_series

COMPONENTS = ("monitoring", "network-policies")
POSTGRES, RABBITMQ, WEB = {5432}, {5672, 5671}, {443, 80}
# Who calls out to the web: providers (row-worker, offloader), webhook receivers (notifier).
WEB_CALLERS = {"row-worker", "offloader", "notifier"}


@functools.cache
def _with_components(overlay: str) -> tuple[Resource, ...]:
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.relpath(K8S / "overlays" / overlay, tmp)
        parts = "".join(f"  - {os.path.relpath(K8S / 'components' / c, tmp)}\n" for c in COMPONENTS)
        (Path(tmp) / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources:\n  - {base}\ncomponents:\n{parts}"
        )
        return tuple(kustomize(Path(tmp)))


def _of_kind(overlay: str, kind: str) -> list[Resource]:
    return [r for r in _with_components(overlay) if r["kind"] == kind]


def _pod(workload: Resource) -> dict[str, Any]:
    return dict(workload["spec"]["template"])


def _component(workload: Resource) -> str:
    return str(_pod(workload)["metadata"]["labels"]["app.kubernetes.io/component"])


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def _ports(rules: list[dict[str, Any]]) -> set[int | str]:
    return {port["port"] for rule in rules for port in rule.get("ports", [])}


def _env_names(workload: Resource) -> set[str]:
    return {e["name"] for c in _pod(workload)["spec"]["containers"] for e in c.get("env", [])}


def _relay_workloads(overlay: str) -> list[Resource]:
    kinds = ("Deployment", "Job")
    return [
        r
        for kind in kinds
        for r in _of_kind(overlay, kind)
        if _pod(r)["metadata"]["labels"].get("app.kubernetes.io/component") != "upstream-sim"
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_components_are_schema_valid(overlay: str) -> None:
    policies = _of_kind(overlay, "NetworkPolicy")
    for version in (MIN_K8S, kubernetes_validate.latest_version()):
        for policy in policies:
            kubernetes_validate.validate(policy, version, strict=True)
    assert len(policies) == len(SERVICES) + 2  # every service, the migration, the deny


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_pod_is_denied_by_default_and_let_through_by_its_own_policy(overlay: str) -> None:
    policies = _of_kind(overlay, "NetworkPolicy")
    workloads = _relay_workloads(overlay)
    assert {_component(w) for w in workloads} == {*SERVICES, "migrate"}
    for workload in workloads:
        labels = _pod(workload)["metadata"]["labels"]
        selecting = [p for p in policies if _selects(p["spec"]["podSelector"], labels)]
        names = sorted(p["metadata"]["name"] for p in selecting)
        assert names == sorted(["relay-default-deny", f"relay-{_component(workload)}"]), names
        for policy in selecting:
            assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_policy_opens_exactly_what_its_pod_uses(overlay: str) -> None:
    policies = {p["metadata"]["name"]: p for p in _of_kind(overlay, "NetworkPolicy")}
    for workload in _relay_workloads(overlay):
        name = _component(workload)
        spec = policies[f"relay-{name}"]["spec"]
        egress = _ports(spec["egress"]) - {53}
        env = _env_names(workload)
        expected = (POSTGRES if "RELAY_DATABASE_URL" in env else set()) | (
            RABBITMQ if "RELAY_AMQP_URL" in env else set()
        )
        expected |= WEB if name in WEB_CALLERS else set()
        assert egress == expected, name
        container_ports = {
            p["name"] for c in _pod(workload)["spec"]["containers"] for p in c.get("ports", [])
        }
        assert _ports(spec["ingress"]) <= container_ports, name
        inbound = _ports(spec["ingress"])
        if name == "migrate":
            assert inbound == set()
        else:
            assert "health" in inbound, name
            assert ("http" in inbound) == (name == "ingest-api"), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pod_monitor_scrapes_every_service_health_port(overlay: str) -> None:
    (monitor,) = _of_kind(overlay, "PodMonitor")
    spec = monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("health", "/metrics")
    relabel = endpoint["relabelings"][0]
    assert relabel["targetLabel"] == "service"
    scraped = set()
    for workload in _relay_workloads(overlay):
        labels = _pod(workload)["metadata"]["labels"]
        if _selects(spec["selector"], labels):
            scraped.add(_component(workload))
            ports = {p["name"] for c in _pod(workload)["spec"]["containers"] for p in c["ports"]}
            assert "health" in ports
    assert scraped == set(SERVICES)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_prometheus_rule_carries_the_rules_file(overlay: str) -> None:
    (rule,) = _of_kind(overlay, "PrometheusRule")
    expected = expected_prometheus_rule()
    assert rule["spec"] == expected["spec"]


def test_the_dashboard_covers_what_an_operator_looks_at_with_served_series() -> None:
    board = dashboard()
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == [
        "Throughput",
        "Backlog",
        "Deployments",
        "Rate limits",
        "Webhooks and offload",
        "Service health",
    ]
    expressions = dashboard_expressions()
    assert len(expressions) >= 30
    assert {where: n for where, expr in expressions.items() if (n := unknown_series(expr))} == {}
    joined = "\n".join(expressions.values())
    for series in (
        "relay_backlog_rows",
        "relay_backlog_oldest_queued_seconds",
        "relay_upstream_calls_total",
        "relay_upstream_throttled_total",
        "relay_ratelimit_rate_fraction",
        "relay_webhook_deliveries_total",
        "relay_offload_rows_total",
        "relay_job_queue_wait_seconds_bucket",
        "relay_job_time_to_finish_seconds_bucket",
        "up{",
    ):
        assert series in joined, series


def test_a_misspelt_series_is_caught() -> None:
    assert unknown_series("sum(rate(relay_rows_procesed_total[5m]))") == {
        "relay_rows_procesed_total"
    }
    assert unknown_series("sum(rate(relay_rows_processed_total[5m]))") == set()
