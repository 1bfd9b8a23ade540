"""Each rendered workload is run the way the issue asks: one Deployment per service with
its console script, both probes on the right port, requests and limits, a restrictive
securityContext, a grace period above the drain grace, and only Secret references."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from relay_batches.router.aliases import load_aliases
from tests.deploy.manifests import (
    OVERLAYS,
    ROUTED_SERVICES,
    RUNTIME_HARD_DEADLINE_S,
    SECRETS,
    SERVICES,
    Rendered,
    Resource,
    component,
    console_scripts,
    containers,
    env_sources,
    pod_spec,
    quantity,
    render,
)

pytestmark = pytest.mark.parametrize("overlay", OVERLAYS)


def _service_deployment(rendered: Rendered, service: str) -> Resource:
    return rendered.get("Deployment", service)


def _port_number(container: Resource, port: str | int) -> int:
    if isinstance(port, int):
        return port
    numbers = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    assert len(numbers) == 1, f"{container['name']}: no container port named {port!r}"
    return int(numbers[0])


def test_one_deployment_per_service_running_its_console_script(overlay: str) -> None:
    rendered = render(overlay)
    scripts = console_scripts()
    for service in SERVICES:
        deployment = _service_deployment(rendered, service)
        assert component(deployment) == service
        (container,) = pod_spec(deployment)["containers"]
        assert container["command"] == [f"relay-{service}"]
        assert container["command"][0] in scripts


def test_only_the_dev_overlay_runs_the_simulator_and_from_its_own_image(overlay: str) -> None:
    """The Relay image carries no simulator (deploy/docker/Dockerfile): the dev overlay's
    simulator runs the image of the Dockerfile's upstream-sim stage, nothing else does."""
    rendered = render(overlay)
    images = {
        component(workload): {c["image"] for c in pod_spec(workload)["containers"]}
        for workload in rendered.workloads()
    }
    sims = {name for name, found in images.items() if any("-sim" in i for i in found)}
    assert sims == ({"upstream-sim"} if overlay == "dev" else set())
    if overlay == "dev":
        assert images["upstream-sim"] == {"relay-batches-sim:dev"}
        assert all(
            found == {"relay-batches:dev"} for name, found in images.items() if name not in sims
        )


def test_the_settings_configmap_is_valid_and_listens_in_cluster(overlay: str) -> None:
    settings = render(overlay).settings()
    assert settings.health_host == "0.0.0.0"
    assert settings.api_host == "0.0.0.0"
    assert settings.health_port > 0
    assert settings.routes_file.startswith("/")


def test_probes_hit_healthz_and_readyz_on_the_service_port(overlay: str) -> None:
    """Prometheus scrapes every service's health port (ingest-api serves /metrics only
    there); ingest-api's probes go to its API port, every other one's to the health port."""
    rendered = render(overlay)
    settings = rendered.settings()
    for service in SERVICES:
        (container,) = pod_spec(_service_deployment(rendered, service))["containers"]
        expected = settings.api_port if service == "ingest-api" else settings.health_port
        annotations = _service_deployment(rendered, service)["spec"]["template"]["metadata"][
            "annotations"
        ]
        assert annotations["prometheus.io/port"] == str(settings.health_port), service
        assert _port_number(container, "health") == settings.health_port, service
        assert annotations["prometheus.io/path"] == "/metrics", service
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            check = container[probe]["httpGet"]
            assert check["path"] == path, (service, probe)
            assert _port_number(container, check["port"]) == expected, (service, probe)


def test_every_deployment_has_both_probes(overlay: str) -> None:
    for deployment in render(overlay).of_kind("Deployment"):
        for container in containers(deployment):
            assert container["livenessProbe"]["httpGet"]["path"], deployment["metadata"]["name"]
            assert container["readinessProbe"]["httpGet"]["path"], deployment["metadata"]["name"]


def test_every_container_has_requests_and_limits(overlay: str) -> None:
    for workload in render(overlay).workloads():
        for container in containers(workload):
            resources = container["resources"]
            for kind in ("cpu", "memory"):
                request = quantity(resources["requests"][kind])
                limit = quantity(resources["limits"][kind])
                assert 0 < request <= limit, (workload["metadata"]["name"], kind)


def test_every_pod_runs_non_root_read_only_without_privileges(overlay: str) -> None:
    for workload in render(overlay).workloads():
        pod = pod_spec(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        for container in containers(workload):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["runAsNonRoot"] is True
            assert context.get("privileged", False) is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert "add" not in context["capabilities"]


def test_termination_grace_covers_the_drain_grace(overlay: str) -> None:
    rendered = render(overlay)
    grace = rendered.settings().shutdown_grace_s
    for service in SERVICES:
        pod = pod_spec(_service_deployment(rendered, service))
        (container,) = pod["containers"]
        pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {})
        needed = pre_stop.get("seconds", 0) + grace + RUNTIME_HARD_DEADLINE_S
        assert pod["terminationGracePeriodSeconds"] >= needed + 5, service
        assert pod["terminationGracePeriodSeconds"] <= needed + 60, service


def test_connections_come_from_the_secret_only(overlay: str) -> None:
    rendered = render(overlay)
    for service in SERVICES:
        (container,) = pod_spec(_service_deployment(rendered, service))["containers"]
        env = dict(env_sources(container))
        for variable in ("RELAY_DATABASE_URL", "RELAY_AMQP_URL"):
            ref = env[variable]["valueFrom"]["secretKeyRef"]
            assert (ref["name"], ref["key"]) == ("relay-connections", variable)
            assert "value" not in env[variable]
    assert all(
        variable not in rendered.settings_env()
        for variable in ("RELAY_DATABASE_URL", "RELAY_AMQP_URL")
    )


def test_only_the_two_documented_secrets_are_referenced(overlay: str) -> None:
    referenced = set()
    for workload in render(overlay).workloads():
        for container in containers(workload):
            for _, source in env_sources(container):
                if "secretRef" in source:
                    referenced.add(source["secretRef"]["name"])
                ref = source.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    referenced.add(ref["name"])
                assert "://" not in str(source.get("value", "")), source
    assert referenced == SECRETS


def test_routed_services_mount_the_routes_file_and_get_provider_keys(
    overlay: str, tmp_path: Path
) -> None:
    rendered = render(overlay)
    routes_file = Path(rendered.settings().routes_file)
    routes_map = rendered.get("ConfigMap", "relay-routes")["metadata"]["name"]
    for service in ROUTED_SERVICES:
        deployment = _service_deployment(rendered, service)
        (container,) = pod_spec(deployment)["containers"]
        volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
        mounts = [m for m in container["volumeMounts"] if m["mountPath"] == str(routes_file.parent)]
        assert len(mounts) == 1, service
        assert volumes[mounts[0]["name"]]["configMap"]["name"] == routes_map
        assert {"secretRef": {"name": "relay-provider-keys", "optional": True}} in container[
            "envFrom"
        ]
    path = tmp_path / routes_file.name
    path.write_text(rendered.routes_toml())
    deployments = tomllib.loads(path.read_text())["deployments"].values()
    keys = {d["api_key_env"] for d in deployments if "api_key_env" in d}
    routes = load_aliases(str(path), dict.fromkeys(keys, "set-by-the-secret"))
    assert routes.resolve("gpt-4o-mini")


def test_configmap_references_resolve(overlay: str) -> None:
    rendered = render(overlay)
    maps = rendered.names("ConfigMap")
    for workload in rendered.workloads():
        for volume in pod_spec(workload).get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in maps
        for container in containers(workload):
            for _, source in env_sources(container):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in maps


def test_the_migration_job_runs_relay_migrate(overlay: str) -> None:
    job = render(overlay).get("Job", "relay-migrate")
    (container,) = pod_spec(job)["containers"]
    assert container["command"] == ["relay", "migrate"]
    assert "relay" in console_scripts()
    assert pod_spec(job)["restartPolicy"] in ("OnFailure", "Never")
    env = dict(env_sources(container))
    assert env["RELAY_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "relay-connections"


def test_the_ingest_api_service_reaches_the_api_port(overlay: str) -> None:
    rendered = render(overlay)
    service = rendered.get("Service", "ingest-api")
    deployment = rendered.get("Deployment", "ingest-api")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (container,) = pod_spec(deployment)["containers"]
    (port,) = service["spec"]["ports"]
    assert _port_number(container, port["targetPort"]) == rendered.settings().api_port
    for ingress in rendered.of_kind("Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                assert backend["name"] == "ingest-api"
                assert backend["port"]["name"] == port["name"]


def test_the_ingest_api_spools_uploads_on_a_writable_volume(overlay: str) -> None:
    deployment = render(overlay).get("Deployment", "ingest-api")
    (container,) = pod_spec(deployment)["containers"]
    spool = dict(env_sources(container))["RELAY_UPLOAD_SPOOL_DIR"]["value"]
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == spool]
    assert not mount.get("readOnly", False)
    assert quantity(volumes[mount["name"]]["emptyDir"]["sizeLimit"]) >= 2 * 256 * 1024 * 1024
