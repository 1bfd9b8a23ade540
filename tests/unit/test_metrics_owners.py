"""Every metric is served by the services that move it: a service's module that imports
a metric is one of its declared movers, each service's registry holds exactly its own,
and the operations page lists every metric."""

from __future__ import annotations

import ast
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from relay_batches import metrics
from relay_batches.metrics import EVERY_SERVICE, moved_by, owned_by, service_registry

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "operations" / "metrics.md"


def _declared() -> dict[str, MetricWrapperBase]:
    return {
        name: value for name, value in vars(metrics).items() if isinstance(value, MetricWrapperBase)
    }


def _imported_metrics(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "relay_batches.metrics"
        for alias in node.names
        if alias.name in _declared()
    }


def test_a_service_moves_only_metrics_that_name_it() -> None:
    declared = _declared()
    checked = 0
    for service in EVERY_SERVICE:
        package = ROOT / "services" / service.replace("-", "_")
        for path in package.rglob("*.py"):
            for name in _imported_metrics(path):
                checked += 1
                movers = moved_by(declared[name])
                assert service in movers, f"{path.relative_to(ROOT)} moves {name}"
    assert checked >= 20


def test_each_service_registry_holds_its_own_metrics_and_no_other() -> None:
    declared = _declared().values()
    assert all(moved_by(metric) for metric in declared)  # each is some service's
    for service in EVERY_SERVICE:
        served = {family.name for family in service_registry(service).collect()}
        assert "process_cpu_seconds" in served, service
        for metric in declared:
            name = metric._name
            assert (name in served) == (service in moved_by(metric)), (service, name)
    assert set(owned_by("upstream-sim")) == set()


def test_the_operations_page_lists_every_metric() -> None:
    text = DOCS.read_text()
    names = {metric._name for metric in _declared().values()}
    names |= {"relay_backlog_rows", "relay_backlog_jobs", "relay_backlog_oldest_queued_seconds"}
    missing = {name for name in names if f"`{name}`" not in text and f"`{name}_total`" not in text}
    assert not missing
