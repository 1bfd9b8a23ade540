"""Every rendered Kubernetes manifest is valid against the Kubernetes schemas, offline.

Both overlays (and each with the row-worker HPA component) are rendered by kustomize and
checked with ``kubernetes-validate`` in strict mode (unknown fields are errors) against
the oldest Kubernetes version the manifests support and the newest the package knows.
KEDA resources are custom resources: ``tests/deploy/keda_checks.py`` checks them structurally.
"""

from __future__ import annotations

import kubernetes_validate
import pytest

from tests.deploy.manifests import MIN_K8S, OVERLAYS, render

K8S_VERSIONS = (MIN_K8S, kubernetes_validate.latest_version())
CUSTOM_APIS = ("keda.sh/",)


@pytest.mark.parametrize("hpa_component", [False, True], ids=["keda", "hpa-component"])
@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_manifest_is_schema_valid(overlay: str, version: str, hpa_component: bool) -> None:
    rendered = render(overlay, hpa_component=hpa_component)
    checked = 0
    errors = []
    for resource in rendered.resources:
        if resource["apiVersion"].startswith(CUSTOM_APIS):
            continue
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(str(p) for p in exc.path)
            errors.append(
                f"{resource['kind']} {resource['metadata']['name']} {where}: {exc.message}"
            )
        checked += 1
    assert errors == []
    assert checked >= 20


def test_strict_validation_rejects_a_misspelt_field() -> None:
    deployment = render("prod").get("Deployment", "row-worker")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 3}}
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(broken, MIN_K8S, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_render_every_kind_the_issue_asks_for(overlay: str) -> None:
    kinds = {r["kind"] for r in render(overlay).resources}
    assert kinds >= {
        "Namespace",
        "ConfigMap",
        "Job",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ScaledObject",
        "TriggerAuthentication",
    }
    assert "Secret" not in kinds


def test_prod_has_the_ingress_example_and_dev_the_simulator() -> None:
    assert render("prod").names("Ingress") == {"ingest-api"}
    assert "upstream-sim" in render("dev").names("Deployment")
    assert "upstream-sim" not in render("prod").names("Deployment")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_everything_lives_in_the_overlay_namespace(overlay: str) -> None:
    rendered = render(overlay)
    (namespace,) = rendered.of_kind("Namespace")
    name = namespace["metadata"]["name"]
    for resource in rendered.resources:
        if resource["kind"] != "Namespace":
            assert resource["metadata"].get("namespace") == name, resource["metadata"]


def test_the_prod_ingress_routes_every_surface_and_the_public_url_is_https() -> None:
    """/v1 alone would leave the OpenAI and Anthropic surfaces 404 behind the Ingress;
    results_url is rooted at the Ingress's TLS host."""
    rendered = render("prod")
    ingress = rendered.get("Ingress", "ingest-api")
    (rule,) = ingress["spec"]["rules"]
    prefixes = {(p["path"], p["pathType"]) for p in rule["http"]["paths"]}
    assert prefixes == {
        ("/v1", "Prefix"),
        ("/openai/v1", "Prefix"),
        ("/anthropic/v1", "Prefix"),
    }
    (tls,) = ingress["spec"]["tls"]
    assert rendered.settings().public_base_url == f"https://{rule['host']}"
    assert rule["host"] in tls["hosts"]
