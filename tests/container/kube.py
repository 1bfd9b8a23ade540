"""The rendered dev overlay, adapted to what ``podman kube play`` (4.3) can run here.

What podman cannot run, and what takes its place (each a change to the rendered YAML only):

- Namespace, ServiceAccount, Service, HorizontalPodAutoscaler, PodDisruptionBudget and
  KEDA's kinds are dropped: podman skips them silently anyway. Without Services there is
  no cluster DNS, so every pod runs on the host's network (``hostNetwork``), and the dev
  routes' ``upstream-sim:8090`` becomes the simulator's address on loopback.
- the upstream-sim Deployment goes: its image (the Dockerfile's upstream-sim stage) is not
  the one under test, which carries no simulator; the check runs the simulator from the
  host's virtualenv on the port the routes name (``ports["upstream-sim"]``).
- no host ports: podman publishes every ``containerPort`` on the host, so the ``ports``
  lists go; every service binds its API and health ports on 127.0.0.1, each a free port
  chosen for the run, set in each container's ``env``. podman 4.3 lets ``envFrom`` win
  over ``env`` (Kubernetes: ``env`` wins), so those keys leave the settings ConfigMap.
- the probes go: podman turns an ``httpGet`` probe into a ``curl`` healthcheck run by
  systemd timers, and the image has no curl and this machine no systemd. The check polls
  every pod's ``/readyz`` itself, as the kubelet would.
- the migration Job becomes a Pod (podman plays no Job) that is run to completion first.
- Secrets become podman secrets (podman cannot read env from a Secret in the YAML): each
  is a JSON map of key to base64 value, the form podman 4.3 reads for ``secretKeyRef``.
- every name gets the run's prefix, so runs never share a pod, volume or secret (podman
  4.3 makes an emptyDir a named volume called by the volume's name: every pod's ``tmp``
  would be one volume, shared by every run, so each becomes the pod's own), and the
  settings' ``RELAY_NAMESPACE`` is the run's own bus namespace; webhooks may go to
  loopback (``RELAY_WEBHOOK_ALLOW_NETWORKS``), where the check's receiver listens.

Everything else is played as rendered: the ConfigMaps (env and the routes volume), the
Secret references, the security contexts (uid 10001, read-only root, no capabilities),
the resource limits and the emptyDir volumes.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Resource = dict[str, Any]

DROPPED_KINDS = frozenset(
    {
        "Namespace",
        "ServiceAccount",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "ScaledObject",
        "TriggerAuthentication",
    }
)
# Set per container (see the module docstring), so never in the shared settings.
LISTENER_KEYS = ("RELAY_API_HOST", "RELAY_API_PORT", "RELAY_HEALTH_HOST", "RELAY_HEALTH_PORT")
SIM_URL = re.compile(r"http://upstream-sim:\d+")


@dataclass
class Adapted:
    """The overlay as podman plays it: ConfigMaps, the migration Pod, the Deployments,
    the podman secrets to create (name to data), and each Deployment's ports."""

    configmaps: list[Resource]
    migrate: Resource
    deployments: list[Resource]
    secrets: dict[str, str]
    ports: dict[str, dict[str, int]] = field(default_factory=dict)


def podman_secret(values: dict[str, str]) -> str:
    """A podman secret's data that ``secretKeyRef`` and ``secretRef`` can read."""
    return json.dumps(
        {key: base64.b64encode(value.encode()).decode() for key, value in values.items()}
    )


def _rename_refs(spec: Resource, rename: Callable[[str], str]) -> None:
    for container in spec["containers"]:
        for source in container.get("envFrom", []):
            for kind in ("configMapRef", "secretRef"):
                if kind in source:
                    source[kind]["name"] = rename(source[kind]["name"])
        for var in container.get("env", []):
            for kind in ("configMapKeyRef", "secretKeyRef"):
                ref = var.get("valueFrom", {}).get(kind)
                if ref is not None:
                    ref["name"] = rename(ref["name"])
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            volume["configMap"]["name"] = rename(volume["configMap"]["name"])


def _set_env(container: Resource, values: dict[str, str]) -> None:
    env = [var for var in container.get("env", []) if var["name"] not in values]
    env.extend({"name": name, "value": value} for name, value in values.items())
    container["env"] = env


def _own_volumes(spec: Resource, owner: str) -> None:
    """Give the pod's emptyDir volumes names of their own (``owner`` is prefixed)."""
    names = {v["name"]: f"{owner}-{v['name']}" for v in spec.get("volumes", []) if "emptyDir" in v}
    for volume in spec.get("volumes", []):
        volume["name"] = names.get(volume["name"], volume["name"])
    for container in spec["containers"]:
        for mount in container.get("volumeMounts", []):
            mount["name"] = names.get(mount["name"], mount["name"])


def _adapt_pod_spec(
    spec: Resource, owner: str, rename: Callable[[str], str], env: dict[str, str]
) -> None:
    spec["hostNetwork"] = True
    _rename_refs(spec, rename)
    _own_volumes(spec, owner)
    for container in spec["containers"]:
        for key in ("ports", "livenessProbe", "readinessProbe", "startupProbe"):
            container.pop(key, None)
        _set_env(container, env)


def adapt(
    rendered: list[Resource],
    *,
    prefix: str,
    namespace: str,
    connections: dict[str, str],
    free_port: Callable[[], int],
) -> Adapted:
    """Adapt the rendered dev overlay (see the module docstring) for one run.

    ``connections`` are the keys of the ``relay-connections`` Secret; ``free_port`` gives
    a port for each listener.
    """

    def rename(name: str) -> str:
        return f"{prefix}-{name}"

    docs = [copy.deepcopy(doc) for doc in rendered if doc["kind"] not in DROPPED_KINDS]
    sim_port = free_port()
    configmaps = [doc for doc in docs if doc["kind"] == "ConfigMap"]
    for cm in configmaps:
        cm["metadata"] = {"name": rename(cm["metadata"]["name"])}
        data = cm["data"]
        if "RELAY_NAMESPACE" in data:
            for key in LISTENER_KEYS:
                data.pop(key, None)
            data["RELAY_NAMESPACE"] = namespace
            data["RELAY_WEBHOOK_ALLOW_NETWORKS"] = "127.0.0.0/8"
        for key, value in data.items():
            data[key] = SIM_URL.sub(f"http://127.0.0.1:{sim_port}", value)

    (job,) = [doc for doc in docs if doc["kind"] == "Job"]
    pod_spec = job["spec"]["template"]["spec"]
    pod_spec["restartPolicy"] = "Never"
    _adapt_pod_spec(pod_spec, rename(job["metadata"]["name"]), rename, {})
    migrate = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": rename(job["metadata"]["name"]), "labels": job["metadata"]["labels"]},
        "spec": pod_spec,
    }

    adapted = Adapted(configmaps, migrate, [], {})
    for deployment in (doc for doc in docs if doc["kind"] == "Deployment"):
        name = deployment["metadata"]["name"]
        spec = deployment["spec"]["template"]["spec"]
        if name == "upstream-sim":
            adapted.ports[name] = {"http": sim_port}  # the host's simulator listens there
            continue
        ports = {"health": free_port()}
        env = {"RELAY_HEALTH_HOST": "127.0.0.1", "RELAY_HEALTH_PORT": str(ports["health"])}
        if name == "ingest-api":
            ports["http"] = free_port()
            env |= {"RELAY_API_HOST": "127.0.0.1", "RELAY_API_PORT": str(ports["http"])}
        _adapt_pod_spec(spec, rename(name), rename, env)
        deployment["metadata"]["name"] = rename(name)
        deployment["metadata"].pop("namespace", None)
        adapted.deployments.append(deployment)
        adapted.ports[name] = ports

    adapted.secrets[rename("relay-connections")] = podman_secret(connections)
    return adapted
