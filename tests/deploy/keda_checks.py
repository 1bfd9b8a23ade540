"""Structural checks of KEDA resources, which the Kubernetes schemas do not cover.

The field lists follow KEDA's v2 ``keda.sh/v1alpha1`` CRDs and the documented trigger
metadata of the PostgreSQL and RabbitMQ scalers (https://keda.sh/docs/2.15/scalers/).
Each check returns a list of problems (empty when fine), so tests can assert on a good
manifest and on deliberately broken copies of it.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate

KEDA_API = "keda.sh/v1alpha1"
SCALED_OBJECT_SPEC = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}
TRIGGER_KEYS = {"type", "name", "metadata", "authenticationRef", "metricType", "useCachedMetrics"}
RABBITMQ_METADATA = {
    "host",
    "hostFromEnv",
    "usernameFromEnv",
    "passwordFromEnv",
    "protocol",
    "queueName",
    "mode",
    "value",
    "activationValue",
    "useRegex",
    "excludeUnacknowledged",
    "pageSize",
    "operation",
    "timeout",
    "vhostName",
    "unsafeSsl",
}
RABBITMQ_PROTOCOLS = {"amqp", "http", "auto"}
POSTGRESQL_METADATA = {
    "query",
    "targetQueryValue",
    "activationTargetQueryValue",
    "connectionFromEnv",
    "host",
    "port",
    "userName",
    "passwordFromEnv",
    "dbName",
    "sslmode",
}
# The TriggerAuthentication parameters that carry each scaler's connection. Not the
# postgresql scaler's `connection`: with it alone KEDA keys its shared pool by empty
# fields, so every such trigger of a cluster shares one (see row-worker-keda.yaml).
AUTH_PARAMETERS = {
    "postgresql": ("host", "port", "userName", "password", "dbName", "sslmode"),
    "rabbitmq": ("host",),
}
# Parameters a TriggerAuthentication must not carry.
AUTH_REFUSED = {"postgresql": ("connection",), "rabbitmq": ()}
RABBITMQ_MODES = {"QueueLength", "MessageRate"}
TRIGGER_AUTH_SPEC = {
    "secretTargetRef",
    "env",
    "configMapTargetRef",
    "hashiCorpVault",
    "podIdentity",
    "azureKeyVault",
    "awsSecretManager",
    "gcpSecretManager",
}

Resource = dict[str, Any]


def _positive_number(text: object) -> bool:
    try:
        return float(str(text)) > 0
    except ValueError:
        return False


def _int_in(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def scaled_object_problems(
    scaled: Resource, deployments: set[str], auths: set[str], k8s_version: str
) -> list[str]:
    """What is wrong with a ScaledObject scaling a Deployment on a PostgreSQL query or a
    RabbitMQ queue."""
    problems: list[str] = []
    if scaled.get("apiVersion") != KEDA_API or scaled.get("kind") != "ScaledObject":
        problems.append(f"not a {KEDA_API} ScaledObject")
    spec = scaled.get("spec") or {}
    problems += [f"unknown spec field {k!r}" for k in sorted(set(spec) - SCALED_OBJECT_SPEC)]
    target = spec.get("scaleTargetRef") or {}
    if target.get("kind", "Deployment") != "Deployment" or target.get("name") not in deployments:
        problems.append(f"scaleTargetRef {target!r} is not a rendered Deployment")
    low, high = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
    if not (_int_in(low, 0) and _int_in(high, 1) and low <= high):
        problems.append(f"replica range {low!r}..{high!r} is not 0 <= min <= max, max >= 1")
    for key in ("pollingInterval", "cooldownPeriod"):
        if key in spec and not _int_in(spec[key], 1):
            problems.append(f"{key} must be a positive integer")
    problems += _behavior_problems(spec, k8s_version)
    triggers = spec.get("triggers")
    if not isinstance(triggers, list) or not triggers:
        return [*problems, "no triggers"]
    for trigger in triggers:
        problems += trigger_problems(trigger, auths)
    return problems


def trigger_problems(trigger: Resource, auths: set[str]) -> list[str]:
    """What is wrong with one trigger (PostgreSQL or RabbitMQ)."""
    if trigger.get("type") == "postgresql":
        return postgresql_trigger_problems(trigger, auths)
    return rabbitmq_trigger_problems(trigger, auths)


def postgresql_trigger_problems(trigger: Resource, auths: set[str]) -> list[str]:
    """What is wrong with one PostgreSQL trigger."""
    problems = [f"unknown trigger field {k!r}" for k in sorted(set(trigger) - TRIGGER_KEYS)]
    meta = trigger.get("metadata") or {}
    problems += [
        f"unknown postgresql metadata {k!r}" for k in sorted(set(meta) - POSTGRESQL_METADATA)
    ]
    if not all(isinstance(v, str) for v in meta.values()):
        problems.append("trigger metadata values must be strings")
    if not str(meta.get("query", "")).strip().upper().startswith("SELECT"):
        problems.append("no query (a SELECT returning one number)")
    if not _positive_number(meta.get("targetQueryValue")):
        problems.append("targetQueryValue must be a positive number")
    auth = (trigger.get("authenticationRef") or {}).get("name")
    if "connectionFromEnv" not in meta and "host" not in meta and auth not in auths:
        problems.append(f"no connection: authenticationRef {auth!r} is not a rendered auth")
    return problems


def _behavior_problems(spec: Resource, k8s_version: str) -> list[str]:
    """KEDA hands ``advanced.horizontalPodAutoscalerConfig.behavior`` to an HPA: check it so."""
    config = (spec.get("advanced") or {}).get("horizontalPodAutoscalerConfig") or {}
    if "behavior" not in config:
        return []
    probe = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "behavior-check"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
            "maxReplicas": 1,
            "behavior": config["behavior"],
        },
    }
    try:
        kubernetes_validate.validate(probe, k8s_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"advanced HPA behavior: {exc.message}"]
    return []


def rabbitmq_trigger_problems(trigger: Resource, auths: set[str]) -> list[str]:
    """What is wrong with one RabbitMQ trigger."""
    problems = [f"unknown trigger field {k!r}" for k in sorted(set(trigger) - TRIGGER_KEYS)]
    if trigger.get("type") != "rabbitmq":
        return [*problems, f"trigger type {trigger.get('type')!r} is not rabbitmq"]
    meta = trigger.get("metadata") or {}
    problems += [f"unknown rabbitmq metadata {k!r}" for k in sorted(set(meta) - RABBITMQ_METADATA)]
    if not all(isinstance(v, str) for v in meta.values()):
        problems.append("trigger metadata values must be strings")
    if meta.get("protocol", "auto") not in RABBITMQ_PROTOCOLS:
        problems.append(f"protocol {meta.get('protocol')!r} is not one of {RABBITMQ_PROTOCOLS}")
    if meta.get("mode") not in RABBITMQ_MODES or not _positive_number(meta.get("value")):
        problems.append("mode must be QueueLength or MessageRate with a positive value")
    if not meta.get("queueName"):
        problems.append("no queueName")
    auth = (trigger.get("authenticationRef") or {}).get("name")
    if "host" not in meta and "hostFromEnv" not in meta and auth not in auths:
        problems.append(f"no broker host: authenticationRef {auth!r} is not a rendered auth")
    return problems


def trigger_auth_problems(auth: Resource, scaler: str) -> list[str]:
    """What is wrong with a TriggerAuthentication that reads ``scaler``'s connection (the
    ledger or broker URL) from a Secret."""
    problems: list[str] = []
    if auth.get("apiVersion") != KEDA_API or auth.get("kind") != "TriggerAuthentication":
        problems.append(f"not a {KEDA_API} TriggerAuthentication")
    spec = auth.get("spec") or {}
    problems += [f"unknown spec field {k!r}" for k in sorted(set(spec) - TRIGGER_AUTH_SPEC)]
    refs = spec.get("secretTargetRef") or []
    for ref in refs:
        if set(ref) != {"parameter", "name", "key"} or not all(ref.values()):
            problems.append(f"secretTargetRef {ref!r} needs parameter, name and key")
    given = {ref.get("parameter") for ref in refs}
    for parameter in AUTH_PARAMETERS[scaler]:
        if parameter not in given:
            problems.append(f"no secretTargetRef for the {scaler} {parameter!r} parameter")
    for parameter in AUTH_REFUSED[scaler]:
        if parameter in given:
            problems.append(f"the {scaler} {parameter!r} parameter shares one KEDA pool")
    return problems
