"""deploy/: the Kubernetes overlays, the compose stack and the image's Dockerfile, checked offline.

Each overlay is rendered with ``kubectl kustomize`` as a cluster would get it; every core object is
validated with ``kubernetes-validate --strict`` (its Python API), every KEDA object with the schema
written from KEDA's documented spec (deploy/kubernetes/keda.schema.json); ``checkov --skip-download``
and ``hadolint`` find nothing that is not skipped in place with a reason; ``yamllint`` passes. The
manifests agree with the app: every ``BILLING_*`` variable is a real setting and the values parse,
every KEDA queue is a queue the app uses for the configured prefix and partitions, each role scales
on its own queues, and the grace period outlasts the shutdown deadline.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import sqlalchemy as sa
import yaml

from billing.autoscale import scale_rules
from shared.settings import Settings
from support.tools import KUBERNETES, OVERLAYS, ROOT, render, require

KEDA_SCHEMA = json.loads((KUBERNETES / "keda.schema.json").read_text())
KEDA_KINDS = {"ScaledObject", "TriggerAuthentication"}
COMPOSE = ROOT / "deploy" / "compose.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


@cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    return tuple(doc for doc in yaml.safe_load_all(render(overlay)) if doc)


def of_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def role_deployments(docs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [
        d for d in of_kind(docs, "Deployment") if d["metadata"]["labels"].get("app.kubernetes.io/name") == "billing"
    ]


def billing_env(docs: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """Every ``BILLING_*`` variable the roles get: the ConfigMap, the Secret, the containers' own env."""
    env: dict[str, str] = {}
    for config in of_kind(docs, "ConfigMap"):
        env.update(config.get("data", {}))
    for secret in of_kind(docs, "Secret"):
        env.update({k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()})
    for deployment in role_deployments(docs):
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            env.update({e["name"]: e.get("value", "") for e in container.get("env", [])})
    return {name: value for name, value in env.items() if name.startswith("BILLING_")}


def compose_env() -> dict[str, str]:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    return {
        k: str(v) for s in services.values() for k, v in s.get("environment", {}).items() if k.startswith("BILLING_")
    }


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a role builds from exactly ``env`` (a wrong value fails validation here)."""
    for name in [n for n in os.environ if n.upper().startswith("BILLING_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_is_valid(overlay: str) -> None:
    checked = []
    for doc in rendered(overlay):
        if doc["kind"] in KEDA_KINDS:
            jsonschema.validate(doc, KEDA_SCHEMA)
        else:
            kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
        checked.append(doc["kind"])
    assert {"Deployment", "PodDisruptionBudget", "ConfigMap", "ScaledObject", "TriggerAuthentication"} <= set(checked)


def test_strict_validation_and_the_keda_schema_refuse_mistakes() -> None:
    """The checks above can fail: a misspelt field, a number where KEDA wants a string, a trigger
    parameter that does not exist."""
    docs = rendered("local")
    deployment = copy.deepcopy(of_kind(docs, "Deployment")[0])
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)
    scaled = of_kind(docs, "ScaledObject")[0]
    for mistake in (
        lambda s: s["spec"]["triggers"][0]["metadata"].update(queueLength=5),
        lambda s: s["spec"]["triggers"][0]["metadata"].update(queueLenght="5"),
        lambda s: s["spec"].update(cooldownPeriod="30"),
        lambda s: s["spec"].pop("scaleTargetRef"),
    ):
        wrong = copy.deepcopy(scaled)
        mistake(wrong)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, KEDA_SCHEMA)


def checkov_findings(args: list[str]) -> dict[str, Any]:
    checkov = require("checkov", "static analysis of the manifests and the Dockerfile")
    done = subprocess.run(
        [checkov, "--skip-download", "--quiet", "--compact", "-o", "json", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(done.stdout)
    return report if isinstance(report, dict) else {"results": {}, "summary": {"passed": 0}}


@pytest.mark.parametrize("target", [*OVERLAYS, "Dockerfile"])
def test_checkov_finds_nothing_unexplained(target: str, tmp_path: Path) -> None:
    if target == "Dockerfile":
        report = checkov_findings(["-f", str(DOCKERFILE), "--framework", "dockerfile"])
    else:
        manifests = tmp_path / f"{target}.yaml"
        manifests.write_text(render(target))
        report = checkov_findings(["-f", str(manifests), "--framework", "kubernetes"])
    results = report["results"]
    assert report["summary"]["passed"] > 0, "checkov checked nothing"
    assert [(f["check_id"], f["resource"]) for f in results.get("failed_checks", [])] == []
    for skipped in results.get("skipped_checks", []):
        assert len(skipped.get("suppress_comment", "").strip()) > 10, (
            f"{skipped['check_id']} is skipped without a reason"
        )


def test_hadolint_passes_the_dockerfile() -> None:
    hadolint = require("hadolint", "lints the Dockerfile; pip install -e '.[test]' brings it")
    done = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_yamllint_passes_deploy() -> None:
    yamllint = require("yamllint", "lints deploy/*.yaml")
    deploy = ROOT / "deploy"
    done = subprocess.run(
        [yamllint, "--strict", "-c", str(deploy / ".yamllint.yaml"), str(deploy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def env_sources() -> Iterator[Any]:
    for overlay in OVERLAYS:
        yield pytest.param(lambda overlay=overlay: billing_env(rendered(overlay)), id=overlay)
    yield pytest.param(compose_env, id="compose")


@pytest.mark.parametrize("read_env", env_sources())
def test_every_billing_variable_is_a_setting_and_parses(read_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    env = read_env()
    fields = {f"BILLING_{name.upper()}" for name in Settings.model_fields}
    assert env and set(env) <= fields, set(env) - fields
    settings = settings_from(env, monkeypatch)
    assert settings.health_port is not None, "probes and the image's health check need the health port"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_role_scales_on_its_own_queues(overlay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every queue a KEDA trigger names is one the app uses for the configured prefix and
    partitions: the processor all input queues, the initiator the requests, the controller the results."""
    docs = rendered(overlay)
    settings = settings_from(billing_env(docs), monkeypatch)
    queues = {rule.role: [t.queue for t in rule.triggers] for rule in scale_rules(docs)}
    assert queues == {
        "initiator": [settings.requests_queue],
        "processor": settings.input_queues,
        "controller": [settings.results_queue],
    }
    for scaled in of_kind(docs, "ScaledObject"):
        auth = {t["authenticationRef"]["name"] for t in scaled["spec"]["triggers"]}
        assert auth == {doc["metadata"]["name"] for doc in of_kind(docs, "TriggerAuthentication")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_outlast_the_shutdown_deadline_and_probe_the_health_port(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = rendered(overlay)
    settings = settings_from(billing_env(docs), monkeypatch)
    deployments = role_deployments(docs)
    assert len(deployments) == 3
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] > settings.shutdown_deadline + 10
        assert pod["securityContext"]["runAsNonRoot"] is True
        (container,) = pod["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {m["mountPath"] for m in container["volumeMounts"]} == {str(settings.home), "/tmp"}
        assert container["ports"] == [{"name": "http", "containerPort": settings.health_port, "protocol": "TCP"}]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    grace = {name: s["stop_grace_period"] for name, s in services.items() if "stop_grace_period" in s}
    assert grace and all(int(value.rstrip("s")) > settings.shutdown_deadline + 10 for value in grace.values())


def test_the_azure_overlay_holds_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workload identity: KEDA and the roles reach storage, and PostgreSQL by Entra login, with no key,
    password or Secret."""
    docs = rendered("azure")
    assert of_kind(docs, "Secret") == []
    assert "secretRef" not in json.dumps(docs) and "secretKeyRef" not in json.dumps(docs)
    (auth,) = of_kind(docs, "TriggerAuthentication")
    assert auth["spec"] == {"podIdentity": auth["spec"]["podIdentity"]}
    assert auth["spec"]["podIdentity"]["provider"] == "azure-workload"
    settings = settings_from(billing_env(docs), monkeypatch)
    assert settings.storage_connection_string is None and settings.storage_account_url
    assert sa.make_url(settings.sql_url_value).password is None
    assert of_kind(docs, "ConfigMap")[0]["data"]["AZURE_TOKEN_CREDENTIALS"] == "WorkloadIdentityCredential"
    for scaled in of_kind(docs, "ScaledObject"):
        assert all(t["metadata"].get("accountName") for t in scaled["spec"]["triggers"])
    for deployment in role_deployments(docs):
        assert deployment["spec"]["template"]["metadata"]["labels"]["azure.workload.identity/use"] == "true"
