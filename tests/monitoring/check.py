"""``make monitoring-check``: Prometheus' own checks of ``deploy/monitoring``, by promtool.

1. ``promtool check rules`` on the rules file;
2. ``promtool test rules`` on its unit tests (each alert fires on a synthetic series and
   stays quiet on a healthy system's);
3. every expression of the Grafana dashboard, written as a recording rule into
   ``test-output/monitoring/dashboard-rules.yaml`` (Grafana's interval variables as
   ranges), through ``promtool check rules``;
4. every metric name of the rules and the dashboard is one a Relay service serves (or
   ``up``, the process series, kube-state-metrics'): what promtool cannot know;
5. the PrometheusRule of ``deploy/k8s/components/monitoring`` carries exactly the rules
   file's groups (``--write`` rewrites it from the rules file).

One line per step; exits 1 at the first failure, with promtool's output.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.monitoring.files import (
    PROMETHEUS_RULE,
    ROOT,
    RULE_TESTS,
    RULES,
    alert_expressions,
    dashboard_expressions,
    prometheus_rule,
    recording_rules,
    rules,
    unknown_series,
)

OUTPUT = ROOT / "test-output" / "monitoring"
RULE_HEADER = (
    "# The alerting rules of deploy/monitoring/relay-rules.yaml as a PrometheusRule\n"
    "# (prometheus-operator). Generated: edit the rules file, then run\n"
    "# `python -m tests.monitoring.check --write`; make monitoring-check fails while the\n"
    "# two differ.\n"
)


def promtool(*args: str) -> None:
    """Run promtool; raise with its output when it fails."""
    binary = shutil.which("promtool")
    if binary is None:
        raise SystemExit("promtool is missing: `make monitoring-check` installs it")
    done = subprocess.run(
        [binary, *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )
    if done.returncode != 0:
        raise SystemExit(f"promtool {' '.join(args)} failed:\n{done.stdout}{done.stderr}")


def expected_prometheus_rule() -> dict[str, object]:
    """The PrometheusRule carrying the rules file's groups."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "relay-batches",
            "labels": {"app.kubernetes.io/component": "monitoring"},
        },
        "spec": {"groups": rules()["groups"]},
    }


def write_prometheus_rule() -> None:
    """Rewrite the component's PrometheusRule from the rules file."""
    body = yaml.safe_dump(expected_prometheus_rule(), sort_keys=False, width=100)
    PROMETHEUS_RULE.write_text(RULE_HEADER + body)


def check_names() -> None:
    """Every series the rules and the dashboard select exists."""
    expressions = {**alert_expressions(), **dashboard_expressions()}
    unknown = {
        where: sorted(n) for where, expr in expressions.items() if (n := unknown_series(expr))
    }
    if unknown:
        raise SystemExit(f"series no Relay service serves: {unknown}")


def main(argv: list[str]) -> None:
    """Run every step (``--write``: rewrite the PrometheusRule first)."""
    if "--write" in argv:
        write_prometheus_rule()
    OUTPUT.mkdir(parents=True, exist_ok=True)
    promtool("check", "rules", str(RULES))
    print(f"promtool check rules: {RULES.relative_to(ROOT)} ({len(alert_expressions())} alerts)")
    promtool("test", "rules", str(RULE_TESTS))
    print(f"promtool test rules: {RULE_TESTS.relative_to(ROOT)}")
    expressions = dashboard_expressions()
    generated = OUTPUT / "dashboard-rules.yaml"
    generated.write_text(recording_rules(expressions))
    promtool("check", "rules", str(generated))
    print(f"promtool check rules: {len(expressions)} dashboard expressions ({generated.name})")
    check_names()
    print("every series of the rules and the dashboard is served")
    if prometheus_rule() != expected_prometheus_rule():
        raise SystemExit(
            f"{Path(PROMETHEUS_RULE).relative_to(ROOT)} differs from the rules file:"
            " run `python -m tests.monitoring.check --write`"
        )
    print("the PrometheusRule carries the rules file's groups")


if __name__ == "__main__":
    main(sys.argv[1:])
