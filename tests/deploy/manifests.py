"""Rendering and reading the deployment files under ``deploy/`` for the tests.

Overlays are rendered by the real kustomize that ships inside ``kubectl`` (part of this
machine image); nothing here talks to a cluster.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from relay_batches.runtime import HARD_DEADLINE_MARGIN_S
from relay_batches.settings import Settings
from tests.helpers.processes import SERVICES as SERVICES  # every Relay service

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = ("dev", "prod")
HPA_COMPONENT = K8S / "components" / "row-worker-hpa"
# The row-worker ScaledObject: tests/integration/test_scaling_backlog.py runs its query.
KEDA_MANIFEST = K8S / "base" / "row-worker-keda.yaml"
# Services that load the routes file at start-up (and so need it and the provider keys).
ROUTED_SERVICES = ("ingest-api", "dispatcher", "row-worker", "offloader")
# relay_batches.runtime waits RELAY_SHUTDOWN_GRACE_S, then this long more before exiting 1.
RUNTIME_HARD_DEADLINE_S = HARD_DEADLINE_MARGIN_S
SECRETS = {"relay-connections", "relay-provider-keys"}
WORKLOAD_KINDS = ("Deployment", "Job")
# The oldest Kubernetes the manifests target: ingest-api's lifecycle.preStop.sleep is on
# by default from 1.30.
MIN_K8S = "1.30.0"

Resource = dict[str, Any]


def kustomize(path: Path) -> list[Resource]:
    """Render the kustomization at ``path`` with ``kubectl kustomize``."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise AssertionError("kubectl (with its built-in kustomize) is needed to render deploy/k8s")
    done = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"kustomize {path} failed: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@functools.cache
def _rendered(overlay: str, component: bool) -> tuple[Resource, ...]:
    if not component:
        return tuple(kustomize(K8S / "overlays" / overlay))
    with tempfile.TemporaryDirectory() as tmp:
        # kustomize accepts only relative paths to other kustomizations.
        base = os.path.relpath(K8S / "overlays" / overlay, tmp)
        extra = os.path.relpath(HPA_COMPONENT, tmp)
        (Path(tmp) / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources:\n  - {base}\ncomponents:\n  - {extra}\n"
        )
        return tuple(kustomize(Path(tmp)))


@dataclass(frozen=True)
class Rendered:
    """One rendered overlay with lookups by kind and name."""

    overlay: str
    resources: tuple[Resource, ...]

    def of_kind(self, kind: str) -> list[Resource]:
        """Every resource of ``kind``."""
        return [r for r in self.resources if r["kind"] == kind]

    def get(self, kind: str, name: str) -> Resource:
        """The one resource of ``kind`` named ``name`` (generated names match by prefix)."""
        found = [r for r in self.of_kind(kind) if _base_name(r) == name]
        assert len(found) == 1, f"{self.overlay}: expected one {kind} {name}, found {len(found)}"
        return found[0]

    def names(self, kind: str) -> set[str]:
        """Names of every resource of ``kind`` as rendered (with hash suffixes)."""
        return {r["metadata"]["name"] for r in self.of_kind(kind)}

    def workloads(self) -> list[Resource]:
        """Every Deployment and Job."""
        return [r for r in self.resources if r["kind"] in WORKLOAD_KINDS]

    def settings_env(self) -> dict[str, str]:
        """The data of the settings ConfigMap, as the pods' environment sees it."""
        return {k: str(v) for k, v in self.get("ConfigMap", "relay-settings")["data"].items()}

    def settings(self) -> Settings:
        """The settings the services read from that ConfigMap."""
        return Settings.from_env(self.settings_env())

    def routes_toml(self) -> str:
        """The routes file served from the routes ConfigMap."""
        data = self.get("ConfigMap", "relay-routes")["data"]
        assert list(data) == ["routes.toml"], data
        return str(data["routes.toml"])


def render(overlay: str, *, hpa_component: bool = False) -> Rendered:
    """The overlay rendered once per session (optionally with the row-worker HPA component)."""
    return Rendered(overlay, _rendered(overlay, hpa_component))


def _base_name(resource: Resource) -> str:
    name = str(resource["metadata"]["name"])
    if resource["kind"] in ("ConfigMap", "Secret"):
        prefix, _, suffix = name.rpartition("-")
        if prefix and len(suffix) == 10 and suffix.isalnum():
            return prefix
    return name


def pod_spec(workload: Resource) -> Resource:
    """The pod spec of a Deployment or Job."""
    return dict(workload["spec"]["template"]["spec"])


def pod_labels(workload: Resource) -> dict[str, str]:
    """The labels of a workload's pods."""
    return dict(workload["spec"]["template"]["metadata"].get("labels", {}))


def containers(workload: Resource) -> list[Resource]:
    """Every container and init container of a workload."""
    spec = pod_spec(workload)
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def component(resource: Resource) -> str:
    """The ``app.kubernetes.io/component`` label of a resource."""
    return str(resource["metadata"].get("labels", {}).get("app.kubernetes.io/component", ""))


def env_sources(container: Resource) -> Iterator[tuple[str, Resource]]:
    """``(variable name or '*', source)`` for every env and envFrom entry of a container."""
    for entry in container.get("env", []):
        yield entry["name"], entry
    for entry in container.get("envFrom", []):
        yield "*", entry


def console_scripts() -> set[str]:
    """The console scripts pyproject.toml installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["scripts"])


def selector_matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """True when every selector label is present with the same value."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def quantity(value: str | int | float) -> float:
    """A Kubernetes quantity (``250m``, ``1``, ``128Mi``, ``1Gi``) as a plain number."""
    text = str(value)
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    return float(text)


def load_yaml(path: Path) -> Any:
    """Parse one YAML document."""
    return yaml.safe_load(path.read_text())


def backlog_query() -> str:
    """The query of the base ScaledObject's one trigger, as KEDA reads it."""
    scaled = next(
        d for d in yaml.safe_load_all(KEDA_MANIFEST.read_text()) if d["kind"] == "ScaledObject"
    )
    (trigger,) = scaled["spec"]["triggers"]
    return str(trigger["metadata"]["query"])
