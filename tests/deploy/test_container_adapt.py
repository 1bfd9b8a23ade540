"""The dev overlay as ``make container-check`` adapts it for ``podman kube play``
(tests/container/kube.py), checked offline: what podman cannot run is gone, and every
reference of what it plays still resolves to something of the run."""

from __future__ import annotations

import itertools
import tomllib

from tests.container.kube import DROPPED_KINDS, LISTENER_KEYS, Adapted, adapt
from tests.deploy.manifests import containers, render

PREFIX = "rc1"
CONNECTIONS = {"RELAY_DATABASE_URL": "postgresql://db/x", "RELAY_AMQP_URL": "amqp://mq/"}


def _adapted() -> Adapted:
    ports = itertools.count(40000)
    return adapt(
        list(render("dev").resources),
        prefix=PREFIX,
        namespace="tcheck1",
        connections=CONNECTIONS,
        free_port=lambda: next(ports),
    )


def test_every_deployment_and_the_job_are_kept_and_nothing_podman_skips() -> None:
    rendered = render("dev")
    adapted = _adapted()
    # But the simulator's: the image under test carries none; the host's runs instead.
    assert {d["metadata"]["name"] for d in adapted.deployments} == {
        f"{PREFIX}-{d['metadata']['name']}" for d in rendered.of_kind("Deployment")
    } - {f"{PREFIX}-upstream-sim"}
    assert "upstream-sim" in {d["metadata"]["name"] for d in rendered.of_kind("Deployment")}
    assert adapted.migrate["kind"] == "Pod"
    assert adapted.migrate["spec"]["restartPolicy"] == "Never"
    assert adapted.migrate["spec"]["containers"][0]["command"] == ["relay", "migrate"]
    played = [*adapted.configmaps, adapted.migrate, *adapted.deployments]
    assert not {doc["kind"] for doc in played} & DROPPED_KINDS


def test_every_reference_resolves_to_a_prefixed_configmap_secret_or_volume() -> None:
    adapted = _adapted()
    configmaps = {cm["metadata"]["name"] for cm in adapted.configmaps}
    assert all(name.startswith(f"{PREFIX}-") for name in configmaps | set(adapted.secrets))
    empty_dirs: list[str] = []
    for workload in [adapted.migrate, *adapted.deployments]:
        spec = workload["spec"].get("template", {}).get("spec", workload["spec"])
        assert spec["hostNetwork"] is True
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for volume in volumes.values():
            # podman names a configMap volume after its ConfigMap, an emptyDir after itself.
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps
            else:
                assert volume["name"].startswith(f"{PREFIX}-"), volume
                empty_dirs.append(volume["name"])
        for container in spec["containers"]:
            assert not {"ports", "livenessProbe", "readinessProbe"} & set(container)
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in configmaps
                elif not source["secretRef"].get("optional"):
                    assert source["secretRef"]["name"] in adapted.secrets
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert ref["name"] in adapted.secrets and ref["key"] in CONNECTIONS
    assert len(empty_dirs) == len(set(empty_dirs)), "a pod's emptyDir is its own"


def test_listeners_are_per_container_loopback_ports_and_the_routes_reach_the_simulator() -> None:
    adapted = _adapted()
    (settings,) = [cm for cm in adapted.configmaps if "RELAY_NAMESPACE" in cm["data"]]
    assert settings["data"]["RELAY_NAMESPACE"] == "tcheck1"
    assert not set(LISTENER_KEYS) & set(settings["data"])
    all_ports = [port for ports in adapted.ports.values() for port in ports.values()]
    assert len(all_ports) == len(set(all_ports))
    for deployment in adapted.deployments:
        name = deployment["metadata"]["name"].removeprefix(f"{PREFIX}-")
        (container,) = containers(deployment)
        env = {var["name"]: var.get("value") for var in container["env"]}
        assert env["RELAY_HEALTH_PORT"] == str(adapted.ports[name]["health"])
        assert env["RELAY_HEALTH_HOST"] == "127.0.0.1"
    (routes,) = [cm for cm in adapted.configmaps if "routes.toml" in cm["data"]]
    deployments = tomllib.loads(routes["data"]["routes.toml"])["deployments"]
    sim = f"http://127.0.0.1:{adapted.ports['upstream-sim']['http']}/v1"
    assert {d["base_url"] for d in deployments.values()} == {sim}
