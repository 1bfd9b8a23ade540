"""Reading ``deploy/monitoring``: the rules file, the dashboard's expressions, the metric
names both use, and the PrometheusRule of the monitoring component that carries the
same groups."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.metrics import MetricWrapperBase

from relay_batches import metrics
from relay_batches.metrics import BACKLOG

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "relay-rules.yaml"
RULE_TESTS = MONITORING / "tests" / "relay-rules-test.yaml"
DASHBOARD = MONITORING / "relay-dashboard.json"
COMPONENT = ROOT / "deploy" / "k8s" / "components" / "monitoring"
PROMETHEUS_RULE = COMPONENT / "prometheusrule.yaml"
# Grafana's interval variables, as a range promtool can parse.
GRAFANA_RANGES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
# Series from outside Relay that the files may use.
FOREIGN = {"up", "kube_deployment_status_replicas_unavailable"}
_SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def rules() -> dict[str, Any]:
    """The rules file as YAML."""
    return dict(yaml.safe_load(RULES.read_text()))


def alert_expressions() -> dict[str, str]:
    """Every alert's expression by its name."""
    return {
        rule["alert"]: rule["expr"]
        for group in rules()["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard."""
    return dict(json.loads(DASHBOARD.read_text()))


def dashboard_expressions() -> dict[str, str]:
    """Every target's expression of the dashboard, by ``<panel title> / <refId>``, with
    Grafana's interval variables replaced by ranges."""
    found = {}
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = str(target["expr"])
            for variable, value in GRAFANA_RANGES.items():
                expr = expr.replace(variable, value)
            found[f"{panel['title']} / {target['refId']}"] = expr
    return found


def recording_rules(expressions: dict[str, str]) -> str:
    """A rules file recording each expression (so ``promtool check rules`` parses it)."""
    rules_ = [
        {"record": f"dashboard:expression_{n}", "expr": expr}
        for n, expr in enumerate(expressions.values())
    ]
    return yaml.safe_dump({"groups": [{"name": "relay-dashboard", "rules": rules_}]})


def series_names(expr: str) -> set[str]:
    """The metric names an expression selects (function and label names left out)."""
    without_labels = re.sub(r"\{[^}]*\}", "{}", expr)
    without_groupings = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", without_labels)
    names = set(re.findall(r"\b([a-z_][a-z0-9_]*)\s*[{\[]", without_groupings))
    names |= {n for n in re.findall(r"\b([a-z_][a-z0-9_:]*)\b", without_groupings) if n in FOREIGN}
    return {n for n in names if n.startswith(("relay_", "process_")) or n in FOREIGN}


def known_families() -> set[str]:
    """The family names Relay's services serve (declared metrics and the backlog's)."""
    declared = {
        value._name for value in vars(metrics).values() if isinstance(value, MetricWrapperBase)
    }
    return declared | {family.name for family in BACKLOG.describe()}


def unknown_series(expr: str) -> set[str]:
    """Names ``expr`` selects that no Relay service serves (nor Prometheus, nor
    kube-state-metrics): a typo promtool cannot see."""
    families = known_families()
    unknown = set()
    for name in series_names(expr):
        if name in FOREIGN or name.startswith("process_"):
            continue
        base = name
        for suffix in _SUFFIXES:
            if base.endswith(suffix) and base.removesuffix(suffix) in families:
                base = base.removesuffix(suffix)
                break
        if base not in families:
            unknown.add(name)
    return unknown


def prometheus_rule() -> dict[str, Any]:
    """The PrometheusRule object of the monitoring component."""
    return dict(yaml.safe_load(PROMETHEUS_RULE.read_text()))
