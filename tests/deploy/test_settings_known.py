"""Every ``RELAY_*`` variable the deployment files set or name (compose, Kubernetes,
Dockerfile, routes examples) is a declared setting: a misspelt one would be ignored
silently by the services."""

from __future__ import annotations

import re

from relay_batches.settings import every_setting
from tests.deploy.manifests import DEPLOY, OVERLAYS, render

NAME = re.compile(r"RELAY_[A-Z0-9_]+")


def _declared() -> set[str]:
    return {setting.env for setting in every_setting()}


def _unknown(names: set[str]) -> set[str]:
    declared = _declared()
    return {
        name
        for name in names
        if not (
            name in declared or (name.endswith("_") and any(d.startswith(name) for d in declared))
        )
    }


def test_every_variable_named_under_deploy_is_a_declared_setting() -> None:
    named: dict[str, set[str]] = {}
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.suffix != ".lock"):
        for name in NAME.findall(path.read_text(encoding="utf-8")):
            named.setdefault(name, set()).add(str(path.relative_to(DEPLOY)))
    assert "RELAY_DATABASE_URL" in named  # the scan sees the files
    unknown = _unknown(set(named))
    assert not unknown, {name: sorted(named[name]) for name in sorted(unknown)}


def test_every_variable_a_rendered_overlay_sets_is_a_declared_setting() -> None:
    for overlay in OVERLAYS:
        rendered = render(overlay)
        names = set(rendered.settings_env())
        for workload in rendered.workloads():
            for container in workload["spec"]["template"]["spec"]["containers"]:
                names |= {
                    e["name"] for e in container.get("env", []) if e["name"].startswith("RELAY_")
                }
        assert "RELAY_NAMESPACE" in names, overlay
        assert not _unknown({n for n in names if n.startswith("RELAY_")}), overlay


def test_the_scan_would_catch_a_misspelt_variable() -> None:
    assert _unknown({"RELAY_DATABSE_URL", "RELAY_SIM_", "RELAY_AMQP_URL"}) == {"RELAY_DATABSE_URL"}
