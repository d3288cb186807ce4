"""deploy/: the Kubernetes overlays, the compose stack and the image's Dockerfile, checked offline.

Each overlay is rendered with ``kubectl kustomize`` as a cluster would get it; every core object is
validated with ``kubernetes-validate --strict`` (its Python API), every KEDA object with the schema
written from KEDA's documented spec (deploy/kubernetes/keda.schema.json); ``checkov --skip-download``
and ``hadolint`` find nothing that is not skipped in place with a reason; ``yamllint`` passes. The
manifests agree with the app: every ``BILLING_*`` variable is a real setting and the values parse,
every KEDA queue is a queue the app uses for the configured prefix and partitions, each role scales
on its own queues, and the grace period outlasts the shutdown deadline. KEDA runs in a namespace of
its own, so every storage endpoint its triggers reach is a fully qualified Service name that exists
in the rendered overlay (and an Azurite behind it reads the account from the path) or an Azure one.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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
AZURE_STORAGE_SUFFIX = "core.windows.net"  # KEDA's endpointSuffix for the public cloud
CLUSTER_SERVICES = ".svc.cluster.local"  # <service>.<namespace>.svc.cluster.local: resolves from any namespace


@cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    return tuple(doc for doc in yaml.safe_load_all(render(overlay)) if doc)


def of_kind(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


ROLES = ("initiator", "processor", "controller")


def billing_deployments(docs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    """The Deployments of the billing image: the three roles and the console."""
    return [
        d for d in of_kind(docs, "Deployment") if d["metadata"]["labels"].get("app.kubernetes.io/name") == "billing"
    ]


def role_deployments(docs: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    return [d for d in billing_deployments(docs) if d["metadata"]["labels"]["app.kubernetes.io/component"] in ROLES]


def console(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    (deployment,) = [
        d for d in billing_deployments(docs) if d["metadata"]["labels"]["app.kubernetes.io/component"] == "console"
    ]
    return deployment


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


def test_hadolint_passes_the_dockerfiles() -> None:
    """The image's Dockerfile and those of the locally built compose images (Azurite, PostgreSQL)."""
    hadolint = require("hadolint", "lints the Dockerfile; pip install -e '.[test]' brings it")
    dockerfiles = [DOCKERFILE, *sorted((ROOT / "deploy" / "images").glob("*.Dockerfile"))]
    assert len(dockerfiles) == 3
    done = subprocess.run([hadolint, *map(str, dockerfiles)], capture_output=True, text=True, timeout=60)
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


def env_sources() -> list[Any]:
    overlays = [
        pytest.param(lambda overlay=overlay: billing_env(rendered(overlay)), id=overlay) for overlay in OVERLAYS
    ]
    return [*overlays, pytest.param(compose_env, id="compose")]


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
    # The one reference to a Secret: the console's optional token (read-only without it).
    token = copy.deepcopy(console(docs))
    (container,) = token["spec"]["template"]["spec"]["containers"]
    assert container.pop("env") == [CONSOLE_TOKEN_ENV]
    rest = [doc for doc in docs if doc is not console(docs)] + [token]
    assert "secretRef" not in json.dumps(rest) and "secretKeyRef" not in json.dumps(rest)
    (auth,) = of_kind(docs, "TriggerAuthentication")
    assert auth["spec"] == {"podIdentity": auth["spec"]["podIdentity"]}
    assert auth["spec"]["podIdentity"]["provider"] == "azure-workload"
    settings = settings_from(billing_env(docs), monkeypatch)
    assert settings.storage_connection_string is None and settings.storage_account_url
    assert sa.make_url(settings.sql_url_value).password is None
    assert of_kind(docs, "ConfigMap")[0]["data"]["AZURE_TOKEN_CREDENTIALS"] == "WorkloadIdentityCredential"
    for scaled in of_kind(docs, "ScaledObject"):
        assert all(t["metadata"].get("accountName") for t in scaled["spec"]["triggers"])
    for deployment in billing_deployments(docs):
        assert deployment["spec"]["template"]["metadata"]["labels"]["azure.workload.identity/use"] == "true"


def storage_endpoints(connection: str) -> list[str]:
    """The endpoints an Azure Storage connection string names (the queue's built from the account
    where it names none)."""
    parts = dict(part.split("=", 1) for part in connection.split(";") if part.strip())
    endpoints = [value for key, value in parts.items() if key.endswith("Endpoint")]
    if "QueueEndpoint" not in parts:
        protocol, suffix = (
            parts.get("DefaultEndpointsProtocol", "https"),
            parts.get("EndpointSuffix", AZURE_STORAGE_SUFFIX),
        )
        endpoints.append(f"{protocol}://{parts.get('AccountName', '127.0.0.1')}.queue.{suffix}")
    return endpoints


def keda_urls(docs: Sequence[dict[str, Any]]) -> list[str]:
    """Every URL KEDA uses for the overlay's triggers: those its TriggerAuthentications read (from a
    Secret or ConfigMap of the overlay), those a trigger's metadata holds, and the account a trigger
    names. A source this cannot read (a connection from the target's env, a vault) fails here."""
    secrets = {
        s["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in s.get("data", {}).items()}
        | s.get("stringData", {})
        for s in of_kind(docs, "Secret")
    }
    configs = {c["metadata"]["name"]: c.get("data", {}) for c in of_kind(docs, "ConfigMap")}
    urls = []
    for auth in of_kind(docs, "TriggerAuthentication"):
        spec = {key: value for key, value in auth["spec"].items() if value is not None}
        assert set(spec) <= {"secretTargetRef", "configMapTargetRef", "podIdentity"}, set(spec)
        refs = [(secrets, ref) for ref in spec.get("secretTargetRef", [])]
        refs += [(configs, ref) for ref in spec.get("configMapTargetRef", [])]
        for source, ref in refs:
            value = source[ref["name"]][ref["key"]]  # KeyError: it names an object the overlay lacks
            urls += storage_endpoints(value) if ref["parameter"] == "connection" else [value] if "://" in value else []
    for scaled in of_kind(docs, "ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            metadata = trigger["metadata"]
            assert "connectionFromEnv" not in metadata and "connection" not in metadata, metadata
            urls += [value for value in metadata.values() if "://" in str(value)]
            if "accountName" in metadata:
                suffix = metadata.get("endpointSuffix", AZURE_STORAGE_SUFFIX)
                urls.append(f"https://{metadata['accountName']}.queue.{suffix}")
    return urls


def unreachable(url: str, docs: Sequence[dict[str, Any]]) -> str | None:
    """Why KEDA, in a namespace of its own, could not use ``url``; None when it can: an Azure storage
    endpoint, or <service>.<namespace>.svc.cluster.local for a Service of the overlay in that
    namespace, on one of its ports, whose Azurite (if it runs one) reads the account from the path."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host.endswith("." + AZURE_STORAGE_SUFFIX):
        return None if parts.scheme == "https" else f"{url}: Azure storage over {parts.scheme}"
    if not host.endswith(CLUSTER_SERVICES) or host.count(".") != 4:
        return f"{url}: {host} is neither <service>.<namespace>{CLUSTER_SERVICES} nor an Azure endpoint"
    name, namespace = host.split(".")[:2]
    services = [
        s
        for s in of_kind(docs, "Service")
        if (s["metadata"]["name"], s["metadata"].get("namespace")) == (name, namespace)
    ]
    if not services:
        return f"{url}: no Service {name} in namespace {namespace}"
    (service,) = services
    if parts.port not in {port["port"] for port in service["spec"]["ports"]}:
        return f"{url}: Service {name} has no port {parts.port}"
    selector = service["spec"]["selector"].items()
    for deployment in of_kind(docs, "Deployment"):
        if selector <= deployment["spec"]["template"]["metadata"]["labels"].items():
            for container in deployment["spec"]["template"]["spec"]["containers"]:
                command = [*container.get("command", []), *container.get("args", [])]
                if "azurite" in container["image"] and "--disableProductStyleUrl" not in command:
                    return f"{url}: Azurite would read the account from the host name ({name})"
    return None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_reaches_storage_by_fully_qualified_names(overlay: str) -> None:
    docs = rendered(overlay)
    urls = keda_urls(docs)
    assert urls, "KEDA's triggers name no endpoint"
    assert [problem for url in urls if (problem := unreachable(url, docs))] == []


def test_a_bare_or_misplaced_service_name_is_refused() -> None:
    """The check above can fail: the local overlay's connection string with Azurite's bare name, or
    another namespace's, or its Azurite without path-style accounts."""
    docs = rendered("local")
    assert any(CLUSTER_SERVICES in url for url in keda_urls(docs)), "the local overlay reaches a cluster Service"

    def changed(host: str | None = None, *, drop_flag: bool = False) -> list[str]:
        docs_ = copy.deepcopy(list(docs))
        for secret in of_kind(docs_, "Secret"):
            for key, value in secret.get("data", {}).items():
                text = base64.b64decode(value).decode()
                if host is not None:
                    text = text.replace("azurite.billing.svc.cluster.local", host)
                secret["data"][key] = base64.b64encode(text.encode()).decode()
        for deployment in of_kind(docs_, "Deployment"):
            for container in deployment["spec"]["template"]["spec"]["containers"]:
                if drop_flag and "--disableProductStyleUrl" in container.get("args", []):
                    container["args"].remove("--disableProductStyleUrl")
        return [problem for url in keda_urls(docs_) if (problem := unreachable(url, docs_))]

    assert changed() == []
    assert any("azurite is neither" in problem for problem in changed("azurite"))
    assert any("no Service azurite in namespace default" in p for p in changed("azurite.default.svc.cluster.local"))
    assert any("Azurite would read the account" in problem for problem in changed(drop_flag=True))


#: The console's token: from the Secret "billing-console" when it exists (read-only without it).
CONSOLE_TOKEN_ENV = {
    "name": "BILLING_CONSOLE_TOKEN",
    "valueFrom": {"secretKeyRef": {"name": "billing-console", "key": "token", "optional": True}},
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_console_is_one_replica_behind_a_cluster_service(overlay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``billing serve`` as a Deployment of one replica that KEDA leaves alone, on every address of the
    pod at the port its Service and probes name, with the roles' settings and pod defaults, its token
    from an optional Secret; the Service is ClusterIP only."""
    docs = rendered(overlay)
    deployment = console(docs)
    spec, pod = deployment["spec"], deployment["spec"]["template"]["spec"]
    assert spec["replicas"] == 1
    assert deployment["metadata"]["name"] not in {
        s["spec"]["scaleTargetRef"]["name"] for s in of_kind(docs, "ScaledObject")
    }
    (container,) = pod["containers"]
    args = container["args"]
    assert args[0] == "serve" and args[args.index("--host") + 1] == "0.0.0.0"
    # The image's console target, the roles' image's repository with -console, same tag.
    role_image = role_deployments(docs)[0]["spec"]["template"]["spec"]["containers"][0]["image"]
    repository, tag = role_image.rsplit(":", 1)
    assert container["image"] == f"{repository}-console:{tag}"
    port = int(args[args.index("--port") + 1])
    assert container["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert CONSOLE_TOKEN_ENV in container["env"]
    # `billing serve` takes these options (the CLI's own help).
    from click.testing import CliRunner

    from billing.cli import cli

    usage = CliRunner().invoke(cli, ["serve", "--help"]).output
    assert "--host" in usage and "--port" in usage
    # Probes on what `billing serve` answers, not the roles' health port paths.
    assert container["livenessProbe"]["httpGet"] == {"path": "/openapi.json", "port": "http"}
    assert container["readinessProbe"]["httpGet"]["path"].startswith("/api/batches")
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The same settings as the roles (storage, SQL) and nothing BILLING_* but the token of its own.
    roles = role_deployments(docs)[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == roles["envFrom"]
    assert [e["name"] for e in container["env"]] == ["BILLING_CONSOLE_TOKEN"]
    (service,) = [s for s in of_kind(docs, "Service") if s["metadata"]["name"] == "billing-console"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    # The roles' network policy lets the Service's traffic in on the console's port.
    policies = [p for p in of_kind(docs, "NetworkPolicy") if p["metadata"]["name"] == "billing-roles"]
    (policy,) = policies
    assert (
        policy["spec"]["podSelector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    assert {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]} >= {port}
    settings = settings_from(billing_env(docs), monkeypatch)
    assert settings.console_token is None  # no token in any manifest: only the optional Secret gives one


def test_compose_runs_the_console_read_only_on_loopback() -> None:
    """compose's console: `billing serve` on every address of its container, published on the host's
    loopback only, its own health check (serve has no /healthz), no token unless an override gives one."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    console_service = services["console"]
    command = console_service["command"]
    assert command[0] == "serve" and command[command.index("--host") + 1] == "0.0.0.0"
    port = command[command.index("--port") + 1]
    assert console_service["ports"] == [f"127.0.0.1:{port}:{port}"]
    assert f"127.0.0.1:{port}/openapi.json" in " ".join(console_service["healthcheck"]["test"])
    assert "BILLING_CONSOLE_TOKEN" not in console_service["environment"]
    assert console_service["build"]["target"] == "console" and services["processor"]["build"]["target"] == "roles"
    assert console_service["image"] != services["processor"]["image"]


def test_every_compose_service_has_a_health_check_and_the_roles_wait_on_health() -> None:
    """Each service a `compose up` starts has a health check; every billing service waits for Azurite
    and PostgreSQL to be healthy. The local override changes images only (built on the machine, never
    pulled), so compose.yaml alone still takes the registry's."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    started = {name: s for name, s in services.items() if "profiles" not in s}
    assert set(started) == {"azurite", "postgres", "initiator", "processor", "controller", "console"}
    for name, service in started.items():
        assert service["healthcheck"]["test"][0] == "CMD", name
    for name, service in services.items():
        if name not in ("azurite", "postgres"):
            assert service["depends_on"] == {
                "azurite": {"condition": "service_healthy"},
                "postgres": {"condition": "service_healthy"},
            }, name
    local = yaml.safe_load((ROOT / "deploy" / "compose.local.yaml").read_text())["services"]
    assert set(local) == set(services)
    for name, service in local.items():
        assert set(service) <= {"image", "pull_policy"} and service["pull_policy"] == "never", name
        image = service.get("image", services[name]["image"])
        assert image.startswith("localhost/"), (name, image)
    built = (ROOT / "deploy" / "build-compose-images.sh").read_text()
    images = {service.get("image", services[name]["image"]) for name, service in local.items()}
    assert all(image.split(":")[0].split("/")[-1] in built for image in images), images
