"""The Bicep of deploy/azure, checked offline: no Bicep compiler or Azure runs here.

The files are parsed with ``pycep-parser`` and the parts that carry names and numbers are evaluated
by the small interpreter below (the Bicep subset those parts use: parameters, variables, loops,
string interpolation, ``concat``/``string``, property and index access). What only Azure knows at
deployment (a resource's id, an endpoint) stays a :class:`Ref` naming its expression, so an
assertion against a concrete value fails rather than passes by accident. pycep gives identifiers
and string literals alike, so a bare string that names a symbol in scope is read as that symbol;
the templates use no literal that equals a symbol's name.

Checked: checkov finds nothing that is not skipped in place with a reason; the queues and containers
are exactly those the app derives from its settings for the same prefix and partitions; each role
scales on its own real queues; the apps' settings are real ``BILLING_*`` fields that, read by
:class:`Settings`, name the queues, topic and subscriptions the template creates; the one identity
holds exactly the four data roles, on the storage account and the trigger topic, Monitoring Metrics
Publisher on Application Insights and AcrPull on the registry the template creates; the apps wait for
the PostgreSQL administrator; API versions are GA or a comment says why not; Application Insights takes
Entra tokens only and the roles' exporters get the identity's credential; the alert rules watch the
poison queues, the backlog and failed batches with queries that name what the app uses; no key, connection
string with a key, secret or secure output appears anywhere; the scale numbers equal the KEDA
ScaledObjects of deploy/kubernetes/base; the processor's rules ask one 1,000,000-row batch for a
replica per input queue or more, as ``billing autoscale``'s rule does, with a queueLength that is what
one replica holds of a queue.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from pycep import BicepParser

from billing.autoscale import QueueTrigger, ScaleRule
from shared import telemetry
from shared.settings import Settings
from store import BatchState

ROOT = Path(__file__).resolve().parents[2]
AZURE = ROOT / "deploy" / "azure"
MAIN = AZURE / "main.bicep"
KUBERNETES_BASE = ROOT / "deploy" / "kubernetes" / "base"

# Built-in role definitions by id: the identity's whole set of rights.
QUEUE_DATA_CONTRIBUTOR = "974c5e8b-45b9-4653-ba55-5f855dd0fb88"
BLOB_DATA_CONTRIBUTOR = "ba92f5b4-2d11-453d-a403-e96b0029c9fe"
SERVICE_BUS_DATA_SENDER = "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39"
SERVICE_BUS_DATA_RECEIVER = "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0"
MONITORING_METRICS_PUBLISHER = "3913510d-42f4-4e42-8a64-420c390055eb"
ACR_PULL = "7f951dda-4ed3-4680-a7ca-43fe172d538d"
KEY_VAULT_SECRETS_USER = "4633458b-17de-408a-b874-0445c86b69e6"
ROLES = ("initiator", "processor", "controller")
# Variables the apps get beside BILLING_* settings: standard names read by azure-identity and OpenTelemetry.
STANDARD_ENV = {
    "AZURE_CLIENT_ID",
    "AZURE_TOKEN_CREDENTIALS",
    "APPLICATIONINSIGHTS_CONNECTION_STRING",
    "APPLICATIONINSIGHTS_AUTHENTICATION_STRING",
    "OTEL_SERVICE_NAME",
}
REQUIRED = {"image": "example.azurecr.io/billing:1.0"}
SIZES = [{"queuePrefix": "billing", "partitions": 4}, {"queuePrefix": "acme-pay", "partitions": 7}]
#: A 1,000,000-row file's work items (whole inbox frames of at least BILLING_WORK_ITEM_SIZE rows), and the
#: fewest processor replicas the scale rules must ask for it: one per input queue of the default four.
BIG_BATCH_ITEMS, BIG_BATCH_REPLICAS = 22, 4
#: Work items a processor holds per rating worker beyond the one it rates (BILLING_PREFETCH_PER_WORKER's default).
PREFETCH_PER_WORKER = int(Settings.model_fields["prefetch_per_worker"].default)


@dataclass(frozen=True)
class Ref:
    """A value Azure knows only at deployment, kept as the expression that names it."""

    expr: str

    def __str__(self) -> str:
        return "${" + self.expr + "}"


class Template:
    """One Bicep file, evaluated on demand for the given parameter values."""

    def __init__(self, path: Path, params: dict[str, Any]) -> None:
        self.path = path
        self.doc = _parse(path)
        self._params = params
        self._values: dict[str, Any] = {}

    def resources(self, type_: str) -> dict[str, dict[str, Any]]:
        """The resource declarations of one type, by symbolic name."""
        return {name: r for name, r in self.doc.get("resources", {}).items() if r["type"] == type_}

    def instances(self, declaration: dict[str, Any]) -> list[dict[str, Any]]:
        """A resource's or module's evaluated config, once per iteration of its loop (none when its
        condition is false; a condition known only at deployment counts as true)."""
        config = declaration["config"]
        if "condition" in config and "loop_type" not in config:
            if self.eval(config["condition"], {}) is False:
                return []
            config = config["config"]
        return _as_list(self.eval(config, {}))

    def modules(self) -> Iterator[tuple[Template, dict[str, Any]]]:
        """Each module instance as a template with its evaluated parameters, and its own config."""
        for module in self.doc.get("modules", {}).values():
            for config in self.instances(module):
                yield Template(self.path.parent / module["detail"]["path"], config["params"]), config

    def lookup(self, name: str) -> Any:
        if name not in self._values:
            if name in self.doc.get("parameters", {}):
                param = self.doc["parameters"][name]
                self._values[name] = self._params[name] if name in self._params else self.eval(param["default"], {})
            elif name in self.doc.get("variables", {}):
                self._values[name] = self.eval(self.doc["variables"][name]["value"], {})
            else:  # a resource or module: its properties are known at deployment only
                self._values[name] = Ref(name)
        return self._values[name]

    def symbols(self) -> set[str]:
        return {name for part in ("parameters", "variables", "resources", "modules") for name in self.doc.get(part, {})}

    def eval(self, node: Any, local: dict[str, Any]) -> Any:
        """The value of one pycep expression node, with loop variables ``local``."""
        if isinstance(node, str):
            if node in local:
                return local[node]
            if node in self.symbols():
                return self.lookup(node)
            return self._interpolate(node, local)
        if isinstance(node, list):
            return [self.eval(item, local) for item in node]
        if not isinstance(node, dict):
            return node
        if "loop_type" in node:
            return self._loop(node, local)
        # An expression is a one-key object {"function"|"operator": {...}}; an object property of that
        # name (a log alert's criterion has an "operator") is not.
        if len(node) == 1 and isinstance(node.get("function"), dict):
            return self._call(node["function"], local)
        if len(node) == 1 and isinstance(node.get("operator"), dict):
            return self._operator(node["operator"], local)
        # Keys are names, or interpolated strings: never symbols.
        return {str(self._interpolate(key.strip("'"), local)): self.eval(value, local) for key, value in node.items()}

    def _interpolate(self, text: str, local: dict[str, Any]) -> Any:
        """A string with ``${...}`` parts; a string that is one whole ``${x}`` is the value of ``x``."""
        if whole := _INTERPOLATION.fullmatch(text):
            return self._path(whole.group(1), local)
        return _INTERPOLATION.sub(lambda m: str(self._path(m.group(1), local)), text)

    def _loop(self, node: dict[str, Any], local: dict[str, Any]) -> list[Any]:
        """A ``[for ...: if (condition) {...}]``: the items whose condition is not false (a condition
        known only at deployment counts as true)."""
        kind, detail = node["loop_type"]["type"], node["loop_type"]["detail"]
        if kind == "range":
            start = self.eval(detail["start_index"], local)
            items: list[Any] = list(range(start, start + self.eval(detail["count"], local)))
            name = detail["item_name"] or detail["index_name"]
            scopes = [{**local, name: item} for item in items]
        else:
            index = detail.get("index_name")
            scopes = [
                {**local, detail["item_name"]: item, **({index: i} if index else {})}
                for i, item in enumerate(self.eval(detail["array_name"], local))
            ]
        condition = node.get("condition")
        return [
            self.eval(node["config"], scope)
            for scope in scopes
            if condition is None or self.eval(condition, scope) is not False
        ]

    def _call(self, function: dict[str, Any], local: dict[str, Any]) -> Any:
        args = [self.eval(arg, local) for arg in function["parameters"].values() if arg is not None]
        match function["type"]:
            case "concat" if all(isinstance(arg, list) for arg in args):
                return [item for arg in args for item in arg]
            case "string" if not isinstance(args[0], Ref):
                return json.dumps(args[0]) if isinstance(args[0], bool) else str(args[0])
            case "subscription_resource_id":
                return f"{args[0]}/{args[1]}"
            case "replace" if not any(isinstance(arg, Ref) for arg in args):
                return str(args[0]).replace(str(args[1]), str(args[2]))
            case "empty" if not isinstance(args[0], Ref):
                return len(args[0]) == 0
        return Ref(f"{function['type']}{tuple(args)}")

    def _operator(self, operator: dict[str, Any], local: dict[str, Any]) -> Any:
        kind, operands = operator["type"], operator["operands"]
        if kind in ("property_accessor", "index_accessor"):
            return self._access(self.eval(operands["operand_1"], local), operands["operand_2"], kind, local)
        if kind in ("equals", "not_equals"):
            left, right = (self.eval(operands[k], local) for k in ("operand_1", "operand_2"))
            if isinstance(left, Ref) or isinstance(right, Ref):
                return Ref(json.dumps(operator))
            return (left == right) == (kind == "equals")
        if kind in ("and", "or"):
            left, right = (self.eval(operands[k], local) for k in ("operand_1", "operand_2"))
            if isinstance(left, bool) and isinstance(right, bool):
                return (left and right) if kind == "and" else (left or right)
            return Ref(json.dumps(operator))
        if kind == "not":
            value = self.eval(operands["bool_value"], local)
            return not value if isinstance(value, bool) else Ref(json.dumps(operator))
        if kind == "conditional":
            condition = self.eval(operands["condition"], local)
            if isinstance(condition, bool):
                return self.eval(operands["true_value" if condition else "false_value"], local)
            return Ref(json.dumps(operator))
        if kind == "add":
            left, right = (self.eval(operands[k], local) for k in ("operand_1", "operand_2"))
            return Ref(f"{left}+{right}") if isinstance(left, Ref) or isinstance(right, Ref) else left + right
        return Ref(json.dumps(operator))

    def _access(self, base: Any, key: Any, kind: str, local: dict[str, Any]) -> Any:
        if kind == "index_accessor":
            key = self.eval(key, local)
            return Ref(f"{base.expr}[{key}]") if isinstance(base, Ref) else base[key]
        if isinstance(key, dict):  # a.(b.c): pycep nests the rest of a path to the right
            inner = key["operator"]
            first = self._access(base, inner["operands"]["operand_1"], kind, local)
            return self._access(first, inner["operands"]["operand_2"], inner["type"], local)
        return Ref(f"{base.expr}.{key}") if isinstance(base, Ref) else base[key]

    def _path(self, text: str, local: dict[str, Any]) -> Any:
        """An interpolated ``${a.b.c}``: a symbol and its properties (anything else stays a Ref)."""
        head, *rest = text.split(".")
        if not re.fullmatch(r"[A-Za-z_]\w*", head) or (head not in local and head not in self.symbols()):
            return Ref(text)
        value = self.eval(head, local)
        for key in rest:
            value = Ref(f"{value.expr}.{key}") if isinstance(value, Ref) else value[key]
        return value


_INTERPOLATION = re.compile(r"\$\{([^}]*)\}")


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@cache
def _parse(path: Path) -> dict[str, Any]:
    return dict(BicepParser().parse(file_path=path))


def _template(size: dict[str, Any]) -> Template:
    return Template(MAIN, {**REQUIRED, **size})


def _settings(size: dict[str, Any]) -> Settings:
    return Settings(queue_prefix=size["queuePrefix"], partitions=size["partitions"])


def _apps(template: Template) -> dict[str, dict[str, Any]]:
    """Each role's Container App: the module's evaluated ``app`` resource, by role."""
    apps = {}
    for module, config in template.modules():
        if module.path.name != "app.bicep":
            continue
        for declaration in module.resources("Microsoft.App/containerApps").values():
            (app,) = module.instances(declaration)
            apps[config["params"]["role"]] = app
    assert sorted(apps) == sorted(ROLES)
    return apps


def _env(app: dict[str, Any]) -> dict[str, Any]:
    (container,) = app["properties"]["template"]["containers"]
    return {item["name"]: item["value"] for item in container["env"]}


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size['queuePrefix']}-{size['partitions']}")
def test_queues_and_containers_are_those_the_app_derives(size: dict[str, Any]) -> None:
    template, settings = _template(size), _settings(size)
    queues = template.resources("Microsoft.Storage/storageAccounts/queueServices/queues")["queues"]
    containers = template.resources("Microsoft.Storage/storageAccounts/blobServices/containers")["containers"]
    assert sorted(q["name"] for q in template.instances(queues)) == sorted(settings.all_queues + settings.poison_queues)
    assert sorted(c["name"] for c in template.instances(containers)) == sorted(settings.all_containers)


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size['queuePrefix']}-{size['partitions']}")
def test_every_role_scales_on_its_real_queues(size: dict[str, Any]) -> None:
    template, settings = _template(size), _settings(size)
    expected = {
        "initiator": [settings.requests_queue],
        "processor": settings.input_queues,
        "controller": [settings.results_queue],
    }
    for role, app in _apps(template).items():
        scale = app["properties"]["template"]["scale"]
        assert [rule["custom"]["type"] for rule in scale["rules"]] == ["azure-queue"] * len(expected[role])
        assert [rule["custom"]["metadata"]["queueName"] for rule in scale["rules"]] == expected[role], role
        for rule in scale["rules"]:  # the scaler reads the pipeline's account, as the roles' identity
            assert rule["custom"]["metadata"]["accountName"] == Ref("storage.name")
            assert rule["custom"]["identity"] == Ref("identity.id")
            assert "auth" not in rule["custom"]
        assert app["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {str(Ref("identity.id")): {}}}
        assert app["properties"]["template"]["containers"][0]["args"] == [role]
    assert _apps(template)["processor"]["properties"]["template"]["scale"]["minReplicas"] == 0


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size['queuePrefix']}-{size['partitions']}")
def test_app_settings_are_real_settings_naming_what_the_template_creates(size: dict[str, Any]) -> None:
    template = _template(size)
    topic = template.instances(template.resources("Microsoft.ServiceBus/namespaces/topics")["topic"])[0]
    subscriptions = template.resources("Microsoft.ServiceBus/namespaces/topics/subscriptions")["subscriptions"]
    declared = {s["name"] for s in template.instances(subscriptions)}
    queues = template.resources("Microsoft.Storage/storageAccounts/queueServices/queues")["queues"]
    created = {q["name"] for q in template.instances(queues)}
    fields = {f"BILLING_{name.upper()}" for name in Settings.model_fields}
    for role, app in _apps(template).items():
        env = _env(app)
        assert {name for name in env if name.startswith("BILLING_")} <= fields, role
        assert {name for name in env if not name.startswith("BILLING_")} <= STANDARD_ENV, role
        assert env["AZURE_CLIENT_ID"] == Ref("identity.properties.clientId")
        assert env["AZURE_TOKEN_CREDENTIALS"] == "ManagedIdentityCredential"  # the chain tries nothing else
        assert env["BILLING_STORAGE_ACCOUNT_URL"] == Ref("storage.properties.primaryEndpoints.queue")
        # Telemetry with an Entra token as the identity: Application Insights takes no key.
        assert env["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"] == "Authorization=AAD;ClientId=" + str(
            Ref("identity.properties.clientId")
        )
        assert not {name for name in env if "CONNECTION_STRING" in name and name.startswith("BILLING_")}
        # The literal settings, read as a role reads them, name what the template created.
        literal = {name[len("BILLING_") :].lower(): v for name, v in env.items() if name.startswith("BILLING_")}
        settings = Settings(**{k: v for k, v in literal.items() if not isinstance(v, Ref)})
        assert set(settings.all_queues + settings.poison_queues) == created
        assert settings.trigger_mode == "servicebus" and not settings.trigger_create_subscription
        assert settings.trigger_topic == topic["name"] and settings.trigger_subscription in declared
        assert settings.trigger_subscription == role
    assert declared == set(ROLES)


@pytest.mark.parametrize("create_registry", [True, False], ids=["new-registry", "own-registry"])
def test_the_identity_holds_exactly_its_roles_each_on_one_resource(create_registry: bool) -> None:
    """The four data roles, Monitoring Metrics Publisher on Application Insights (telemetry with an
    Entra token), Key Vault Secrets User on the vault (the console's token) and, when the template
    creates the registry, AcrPull on it; nothing else."""
    template = Template(MAIN, {**REQUIRED, **SIZES[0], "createRegistry": create_registry})
    assignments = [
        assignment
        for declaration in template.resources("Microsoft.Authorization/roleAssignments").values()
        for assignment in template.instances(declaration)
    ]
    by_role = {a["properties"]["roleDefinitionId"].rsplit("/", 1)[1]: a for a in assignments}
    expected = {
        QUEUE_DATA_CONTRIBUTOR: Ref("storage"),
        BLOB_DATA_CONTRIBUTOR: Ref("storage"),
        SERVICE_BUS_DATA_SENDER: Ref("topic"),
        SERVICE_BUS_DATA_RECEIVER: Ref("topic"),
        MONITORING_METRICS_PUBLISHER: Ref("appInsights"),
        KEY_VAULT_SECRETS_USER: Ref("vault"),
    } | ({ACR_PULL: Ref("registry")} if create_registry else {})
    assert len(by_role) == len(assignments) == len(expected)
    assert {role: by_role[role]["scope"] for role in by_role} == expected
    for assignment in assignments:
        assert assignment["properties"]["principalId"] == Ref("identity.properties.principalId")
        assert assignment["properties"]["principalType"] == "ServicePrincipal"
    # One identity, and nothing in any file grants another role.
    assert len(template.resources("Microsoft.ManagedIdentity/userAssignedIdentities")) == 1
    for module, _ in template.modules():
        assert not module.resources("Microsoft.Authorization/roleAssignments")
        assert not module.resources("Microsoft.ManagedIdentity/userAssignedIdentities")


_SECRETS = re.compile(
    r"\blist\w*\s*\(|AccountKey\s*=|SharedAccessKey|Password\s*=|@secure\s*\("
    r"|administratorLoginPassword|DefaultEndpointsProtocol",
    re.IGNORECASE,
)
#: Container Apps secrets appear only in the console, as Key Vault references (checked below).
_APP_SECRETS = re.compile(r"secretRef|\bsecrets\s*:")


def test_no_key_secret_or_secure_output_anywhere() -> None:
    files = sorted(path for path in AZURE.rglob("*") if path.is_file())
    assert {path.suffix for path in files} >= {".bicep", ".md"}
    for path in files:
        found = _SECRETS.findall(path.read_text())
        if path.name not in ("console.bicep", "README.md"):
            found += _APP_SECRETS.findall(path.read_text())
        assert not found, f"{path.relative_to(ROOT)}: {found}"
    template = _template(SIZES[0])
    (storage,) = template.instances(template.resources("Microsoft.Storage/storageAccounts")["storage"])
    (bus,) = template.instances(template.resources("Microsoft.ServiceBus/namespaces")["serviceBus"])
    (postgres,) = template.instances(template.resources("Microsoft.DBforPostgreSQL/flexibleServers")["postgres"])
    assert storage["properties"]["allowSharedKeyAccess"] is False
    assert bus["properties"]["disableLocalAuth"] is True
    assert postgres["properties"]["authConfig"]["passwordAuth"] == "Disabled"
    assert postgres["properties"]["authConfig"]["activeDirectoryAuth"] == "Enabled"
    for doc in (template.doc, *(module.doc for module, _ in template.modules())):
        for parameter in doc.get("parameters", {}).values():
            assert not any(d["type"] == "secure" for d in parameter["decorators"])
        for output in doc.get("outputs", {}).values():
            assert not any(d["type"] == "secure" for d in output["decorators"])
    # The controller logs in to PostgreSQL as the identity, which administers the server: no password.
    sql_url = sa.make_url(_env(_apps(template)["controller"])["BILLING_SQL_URL"])
    assert sql_url.username == str(Ref("identity.name")) and sql_url.password is None
    admins = [config["params"] for module, config in template.modules() if module.path.name == "postgres-admin.bicep"]
    assert admins[0]["objectId"] == Ref("identity.properties.principalId")
    assert admins[0]["principalName"] == Ref("identity.name")
    for app in _apps(template).values():
        assert "secrets" not in app["properties"]["configuration"]
        assert all(set(item) == {"name", "value"} for item in app["properties"]["template"]["containers"][0]["env"])


def test_checkov_finds_nothing_unexplained() -> None:
    """``checkov --skip-download`` on deploy/azure: no failed check; every skip gives its reason."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkov.main",
            "--skip-download",
            "-d",
            str(AZURE),
            "--framework",
            "bicep",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = json.loads(run.stdout)
    results, summary = report["results"], report["summary"]
    assert summary["parsing_errors"] == 0, run.stdout
    assert summary["passed"] > 0, "checkov checked nothing"
    assert not results["failed_checks"], [(c["check_id"], c["resource"]) for c in results["failed_checks"]]
    for check in results["skipped_checks"]:
        assert len(check["check_result"]["suppress_comment"].strip()) > 20, check["check_id"]


def _scaled_objects() -> dict[str, dict[str, Any]]:
    """The KEDA ScaledObjects of the Kubernetes base, by the role their target runs."""
    objects = {}
    for path in sorted(KUBERNETES_BASE.rglob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "ScaledObject":
                target = doc["spec"]["scaleTargetRef"]["name"]
                (role,) = [role for role in ROLES if role in target]
                objects[role] = doc["spec"]
    return objects


def _kubernetes_settings() -> dict[str, str]:
    """The base's ConfigMap: the BILLING_* settings every role's pod gets."""
    lines = (KUBERNETES_BASE / "billing.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


@pytest.mark.skipif(not KUBERNETES_BASE.is_dir(), reason="no deploy/kubernetes/base to compare with")
def test_scale_rules_and_settings_equal_the_kubernetes_base() -> None:
    """Bicep and Kubernetes must not drift: the same queues, bounds, polling, cooldown and thresholds
    for the same prefix and partitions, and the same values of the settings both give. (The base
    runs without Service Bus, ``BILLING_TRIGGER_BACKEND=none``; Azure has it.)"""
    kubernetes = _kubernetes_settings()
    size = {"queuePrefix": kubernetes["BILLING_QUEUE_PREFIX"], "partitions": int(kubernetes["BILLING_PARTITIONS"])}
    objects = _scaled_objects()
    assert sorted(objects) == sorted(ROLES)
    for role, app in _apps(_template(size)).items():
        spec, scale = objects[role], app["properties"]["template"]["scale"]
        bounds = ("minReplicas", "maxReplicas", "pollingInterval", "cooldownPeriod")
        keda = ("minReplicaCount", "maxReplicaCount", "pollingInterval", "cooldownPeriod")
        defaults = (0, 100, 30, 300)  # KEDA's, when a ScaledObject leaves one out
        assert [scale[b] for b in bounds] == [spec.get(k, d) for k, d in zip(keda, defaults, strict=True)], role
        thresholds = ("queueLength", "activationQueueLength")
        bicep_rules = {
            r["custom"]["metadata"]["queueName"]: [r["custom"]["metadata"][k] for k in thresholds]
            for r in scale["rules"]
        }
        keda_rules = {
            t["metadata"]["queueName"]: [
                str(t["metadata"].get(k, d)) for k, d in zip(thresholds, ("5", "0"), strict=True)
            ]
            for t in spec["triggers"]
            if t["type"] == "azure-queue"
        }
        assert bicep_rules == keda_rules, role
        env = _env(app)
        shared = (set(env) & set(kubernetes)) - {"BILLING_TRIGGER_BACKEND"}
        assert {name: env[name] for name in shared} == {name: kubernetes[name] for name in shared}, role
        assert shared >= {"BILLING_QUEUE_PREFIX", "BILLING_PARTITIONS", "BILLING_SHUTDOWN_DEADLINE"}


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size['queuePrefix']}-{size['partitions']}")
def test_one_big_batch_asks_for_a_processor_per_input_queue(size: dict[str, Any]) -> None:
    """A 1,000,000-row batch round-robin over the input queues: Container Apps asks, per rule,
    ceil(depth / queueLength) and takes the largest within the app's bounds; that is at least
    BIG_BATCH_REPLICAS, and ``billing autoscale``'s rule given the same numbers decides the same."""
    settings = _settings(size)
    depths = {
        queue: len(range(i, BIG_BATCH_ITEMS, settings.partitions)) for i, queue in enumerate(settings.input_queues)
    }
    assert sum(depths.values()) == BIG_BATCH_ITEMS and max(depths.values()) - min(depths.values()) <= 1
    scale = _apps(_template(size))["processor"]["properties"]["template"]["scale"]
    rules = [rule["custom"]["metadata"] for rule in scale["rules"]]
    asked = [math.ceil(depths[rule["queueName"]] / int(rule["queueLength"])) for rule in rules]
    replicas = min(max(1, scale["minReplicas"], *asked), scale["maxReplicas"])
    assert replicas >= BIG_BATCH_REPLICAS, (depths, rules, scale["maxReplicas"])
    rule = ScaleRule(
        name="processor",
        role="processor",
        triggers=tuple(
            QueueTrigger(r["queueName"], queue_length=int(r["queueLength"]), activation=int(r["activationQueueLength"]))
            for r in rules
        ),
        min_replicas=scale["minReplicas"],
        max_replicas=scale["maxReplicas"],
    )
    assert rule.active(depths) and rule.wanted(depths) == replicas


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size['queuePrefix']}-{size['partitions']}")
def test_the_processor_queue_length_is_what_one_replica_holds_of_a_queue(size: dict[str, Any]) -> None:
    """queueLength = what one replica holds at once (rating workers x (1 + prefetch)) over the input
    queues, rounded up to a whole message; the workers are set (not left to follow the container's
    quota) and fit the app's vCPU."""
    template = _template(size)
    app = _apps(template)["processor"]
    env = _env(app)
    workers = int(env["BILLING_CPU_WORKERS"])
    (cpu,) = [
        config["params"]["cpu"] for _, config in template.modules() if config["params"].get("role") == "processor"
    ]
    assert 1 <= workers <= float(cpu)
    held = workers * (1 + int(env.get("BILLING_PREFETCH_PER_WORKER", PREFETCH_PER_WORKER)))
    lengths = {r["custom"]["metadata"]["queueLength"] for r in app["properties"]["template"]["scale"]["rules"]}
    assert lengths == {str(math.ceil(held / size["partitions"]))}, (held, lengths)


#: A resource's type and API version as a declaration names them.
_API_VERSION = re.compile(r"^\s*resource\s+\w+\s+'([\w./]+)@([\w-]+)'", re.MULTILINE)


def previews_without_reason(text: str) -> list[str]:
    """The preview API versions in a Bicep file that no comment right above the declaration explains
    (a comment line containing ``preview:``, saying why no GA version has what is used)."""
    lines = text.splitlines()
    unexplained = []
    for number, line in enumerate(lines):
        found = _API_VERSION.match(line)
        if not found or not found.group(2).endswith("-preview"):
            continue
        above = number - 1
        comments = []
        while above >= 0 and lines[above].strip().startswith("//"):
            comments.append(lines[above])
            above -= 1
        if not any("preview:" in comment for comment in comments):
            unexplained.append(f"{found.group(1)}@{found.group(2)}")
    return unexplained


def test_api_versions_are_ga_unless_a_comment_says_why_not() -> None:
    files = sorted(AZURE.rglob("*.bicep"))
    versions = [m.groups() for path in files for m in _API_VERSION.finditer(path.read_text())]
    assert len(versions) > 20, versions
    assert {path.name: previews_without_reason(path.read_text()) for path in files} == {p.name: [] for p in files}
    # GA versions exist for these with everything used: they must not be on a preview.
    ga = ("Microsoft.ServiceBus/", "Microsoft.Insights/components", "Microsoft.Insights/scheduledQueryRules")
    assert [f"{t}@{v}" for t, v in versions if t.startswith(ga) and v.endswith("-preview")] == []
    # The check can fail: a preview without its comment, or a GA type moved back to a preview.
    main = MAIN.read_text()
    bare = re.sub(r"^// preview:.*\n", "", main, flags=re.MULTILINE)
    assert previews_without_reason(bare)
    assert previews_without_reason(main.replace("namespaces@2024-01-01", "namespaces@2022-10-01-preview"))


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size['queuePrefix']}-{size['partitions']}")
def test_apps_start_after_postgres_takes_the_identity_as_administrator(size: dict[str, Any]) -> None:
    """The controller logs in as the identity: every app waits for the server's Entra administrator
    (and the database), as for its role assignments, queues and subscriptions."""
    template = _template(size)
    (apps,) = [m for m in template.doc["modules"].values() if m["detail"]["path"] == "modules/app.bicep"]
    configs = template.instances(apps)
    assert len(configs) == len(ROLES)
    names = {
        name for name, m in template.doc["modules"].items() if m["detail"]["path"] == "modules/postgres-admin.bicep"
    }
    assert "postgresIdentityAdmin" in names
    for config in configs:
        waits = {str(item) for item in config["dependsOn"]}
        assert {str(Ref("postgresIdentityAdmin")), str(Ref("database"))} <= waits
        resources = template.doc["resources"]
        granted = {n for n, r in resources.items() if r["type"] == "Microsoft.Authorization/roleAssignments"}
        assert {str(Ref(name)) for name in granted - {"vaultSecretsUser"}} <= waits  # AcrPull, telemetry too
    (console,) = [m for m in template.doc["modules"].values() if m["detail"]["path"] == "modules/console.bicep"]
    (config,) = template.instances(console)
    waits = {str(item) for item in config["dependsOn"]}
    assert {str(Ref(n)) for n in ("postgresIdentityAdmin", "database", "vaultSecretsUser")} <= waits
    assert _template({**size, "deployApps": False}).instances(apps) == []


def test_application_insights_takes_entra_tokens_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Local authentication off; both exporters the roles build get a token credential, the roles'
    own chain, from the variable the apps are given (shared/telemetry.py), and none without it."""
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.trace.export import SpanExporter

    template = _template(SIZES[0])
    (insights,) = template.instances(template.resources("Microsoft.Insights/components")["appInsights"])
    assert insights["properties"]["DisableLocalAuth"] is True
    auth = _env(_apps(template)["controller"])["APPLICATIONINSIGHTS_AUTHENTICATION_STRING"]
    client_id = "11111111-2222-3333-4444-555555555555"
    made: list[dict[str, Any]] = []

    class Spans(SpanExporter):
        def __init__(self, **kwargs: Any) -> None:
            made.append(kwargs)

    class Metrics(MetricExporter):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__()
            made.append(kwargs)

        def export(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("nothing is exported here")

        def force_flush(self, timeout_millis: float = 0) -> bool:
            return True

        def shutdown(self, timeout_millis: float = 0, **kwargs: Any) -> None:
            pass

    exporters = pytest.importorskip("azure.monitor.opentelemetry.exporter", reason="the [azure-monitor] extra")
    monkeypatch.setattr(exporters, "AzureMonitorTraceExporter", Spans)
    monkeypatch.setattr(exporters, "AzureMonitorMetricExporter", Metrics)
    monkeypatch.setenv(
        "APPLICATIONINSIGHTS_CONNECTION_STRING", "InstrumentationKey=00000000-0000-0000-0000-000000000001"
    )
    monkeypatch.setenv(
        "APPLICATIONINSIGHTS_AUTHENTICATION_STRING", auth.replace(str(Ref("identity.properties.clientId")), client_id)
    )
    monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", "ManagedIdentityCredential")
    tracer_provider, meter_provider = telemetry._providers("test", traces=False, measures=False, azure=True)
    tracer_provider.shutdown()
    meter_provider.shutdown()
    assert len(made) == 2
    for kwargs in made:
        credential = kwargs["credential"]
        assert type(credential).__name__ == "DefaultAzureCredential"
        (chain,) = credential.credentials  # AZURE_TOKEN_CREDENTIALS: the managed identity alone
        assert type(chain).__name__ == "ManagedIdentityCredential"
    monkeypatch.delenv("APPLICATIONINSIGHTS_AUTHENTICATION_STRING")
    assert telemetry.azure_monitor_auth() == {}


def _alerts(template: Template) -> tuple[Template, list[dict[str, Any]], list[dict[str, Any]]]:
    """The alerts module: its template, its evaluated rules and its action groups."""
    ((module, _),) = [(m, c) for m, c in template.modules() if m.path.name == "alerts.bicep"]
    (rules,) = module.resources("Microsoft.Insights/scheduledQueryRules").values()
    groups = [g for d in module.resources("Microsoft.Insights/actionGroups").values() for g in module.instances(d)]
    return module, module.instances(rules), groups


@pytest.mark.parametrize("size", SIZES, ids=lambda size: f"{size['queuePrefix']}-{size['partitions']}")
def test_alert_rules_watch_poison_backlog_and_failed_batches(size: dict[str, Any]) -> None:
    """Three log alerts on the workspace that holds the queue logs and the roles' metrics: messages in
    a poison queue, a queue with work and no progress for backlogAgeMinutes, a batch settled failed.
    Their queries name the pipeline's account, its queues by prefix, and the counter and state the
    controller reports (shared/telemetry.py, store.BatchState)."""
    template = Template(MAIN, {**REQUIRED, **size, "backlogAgeMinutes": 20})
    _, rules, groups = _alerts(template)
    by_name = {rule["name"]: rule for rule in rules}
    prefix = template.lookup("namePrefix")
    assert sorted(by_name) == sorted(f"{prefix}-{name}" for name in ("poison", "backlog-age", "batch-failed"))
    (diagnostics,) = template.instances(template.resources("Microsoft.Insights/diagnosticSettings")["queueDiagnostics"])
    assert {log["category"] for log in diagnostics["properties"]["logs"]} >= {"StorageWrite", "StorageDelete"}
    for rule in rules:
        properties = rule["properties"]
        assert rule["kind"] == "LogAlert" and properties["enabled"] is True
        assert properties["scopes"] == [Ref("logs.id")]  # the workspace the queue logs and telemetry go to
        (criterion,) = properties["criteria"]["allOf"]
        assert (criterion["operator"], criterion["threshold"], criterion["timeAggregation"]) == (
            "GreaterThan",
            0,
            "Count",
        )
        query = criterion["query"]
        assert query.count("(") == query.count(")") and query.count('"') % 2 == 0, query
        assert properties["actions"]["actionGroups"] == []  # no e-mail given: no action group
    queue_logs = f'AccountName == "{Ref("storage.name")}"', f'queue startswith "{size["queuePrefix"]}-"'
    poison = by_name[f"{prefix}-poison"]["properties"]["criteria"]["allOf"][0]["query"]
    assert all(part in poison for part in queue_logs) and 'queue endswith "-poison"' in poison
    backlog = by_name[f"{prefix}-backlog-age"]["properties"]["criteria"]["allOf"][0]["query"]
    assert all(part in backlog for part in queue_logs) and 'not(queue endswith "-poison")' in backlog
    assert "ago(20m)" in backlog
    failed = by_name[f"{prefix}-batch-failed"]["properties"]["criteria"]["allOf"][0]["query"]
    counter = re.search(r'Name == "([\w.]+)"', failed)
    assert counter and f'create_counter("{counter.group(1)}"' in Path(telemetry.__file__).read_text()
    assert f'tostring(Properties.state) == "{BatchState.failed.value}"' in failed
    assert groups == []
    _, rules, groups = _alerts(Template(MAIN, {**REQUIRED, **size, "alertEmail": "ops@example.com"}))
    (group,) = groups
    assert group["properties"]["emailReceivers"][0]["emailAddress"] == "ops@example.com"
    assert all(rule["properties"]["actions"]["actionGroups"] == [Ref("actionGroup.id")] for rule in rules)


def test_the_apps_pull_from_the_registry_as_the_identity() -> None:
    """The template's registry (admin user and anonymous pull off) by default; an existing one, or a
    public image, with createRegistry false."""
    template = Template(MAIN, {**REQUIRED, **SIZES[0], "registryName": "billingacr01"})
    (registry,) = template.instances(template.resources("Microsoft.ContainerRegistry/registries")["registry"])
    assert registry["name"] == "billingacr01"
    assert registry["properties"]["adminUserEnabled"] is False
    assert registry["properties"]["anonymousPullEnabled"] is False

    def registries(params: dict[str, Any]) -> list[Any]:
        found = {
            json.dumps(app["properties"]["configuration"]["registries"], default=str)
            for app in _apps(Template(MAIN, {**REQUIRED, **SIZES[0], **params})).values()
        }
        (one,) = found
        return list(json.loads(one))

    identity = str(Ref("identity.id"))
    assert registries({"registryName": "billingacr01"}) == [{"server": "billingacr01.azurecr.io", "identity": identity}]
    own = {"createRegistry": False, "registryServer": "mine.azurecr.io"}
    assert registries(own) == [{"server": "mine.azurecr.io", "identity": identity}]
    assert registries({"createRegistry": False}) == []  # a public image
    assert (
        Template(MAIN, {**REQUIRED, "createRegistry": False}).instances(
            template.resources("Microsoft.ContainerRegistry/registries")["registry"]
        )
        == []
    )


def _console(template: Template) -> dict[str, Any] | None:
    """The console's Container App, evaluated (None when the template deploys none)."""
    for module, _ in template.modules():
        if module.path.name == "console.bicep":
            (app,) = module.instances(module.resources("Microsoft.App/containerApps")["app"])
            return app
    return None


@pytest.mark.parametrize("token", ["", "console-token"], ids=["read-only", "token"])
def test_the_console_is_one_replica_with_internal_ingress_and_a_vault_token(token: str) -> None:
    """``billing serve`` on every address at the ingress's port, one replica, no scale rule, internal
    ingress by default, the roles' identity and settings with the controller's SQL login; its token a
    Key Vault reference read as the identity (no value anywhere), and no token: read-only."""
    template = Template(MAIN, {**REQUIRED, **SIZES[0], "consoleTokenSecretName": token})
    app = _console(template)
    assert app is not None
    configuration, spec = app["properties"]["configuration"], app["properties"]["template"]
    assert configuration["ingress"]["external"] is False and configuration["ingress"]["allowInsecure"] is False
    (container,) = spec["containers"]
    args = container["args"]
    assert args[0] == "serve" and args[args.index("--host") + 1] == "0.0.0.0"
    assert int(args[args.index("--port") + 1]) == configuration["ingress"]["targetPort"]
    assert spec["scale"] == {"minReplicas": 1, "maxReplicas": 1, "rules": []}
    # The image's console target, beside the roles' image (or the one named).
    assert container["image"] == REQUIRED["image"].replace("/billing:", "/billing-console:")
    named = _console(Template(MAIN, {**REQUIRED, "consoleImage": "example.azurecr.io/ui:2"}))
    assert named is not None and named["properties"]["template"]["containers"][0]["image"] == "example.azurecr.io/ui:2"
    assert app["identity"] == _apps(template)["controller"]["identity"]
    env = {item["name"]: item for item in container["env"]}
    controller = _env(_apps(template)["controller"])
    assert env["BILLING_SQL_URL"]["value"] == controller["BILLING_SQL_URL"]
    assert env["BILLING_STORAGE_ACCOUNT_URL"]["value"] == controller["BILLING_STORAGE_ACCOUNT_URL"]
    probes = {probe["type"]: probe["httpGet"]["path"] for probe in container["probes"]}
    assert probes == {"Liveness": "/openapi.json", "Readiness": "/api/batches?limit=1"}  # no /healthz in serve
    # Every value is literal but the token, which only ever references a Key Vault secret.
    assert all(set(item) == {"name", "value"} for name, item in env.items() if name != "BILLING_CONSOLE_TOKEN")
    if not token:
        assert "BILLING_CONSOLE_TOKEN" not in env and configuration["secrets"] == []
    else:
        (secret,) = configuration["secrets"]
        assert set(secret) == {"name", "keyVaultUrl", "identity"}  # never a "value"
        assert secret["identity"] == Ref("identity.id")
        assert secret["keyVaultUrl"] == f"{Ref('vault.properties.vaultUri')}secrets/{token}"
        assert env["BILLING_CONSOLE_TOKEN"] == {"name": "BILLING_CONSOLE_TOKEN", "secretRef": secret["name"]}
    (vault,) = template.instances(template.resources("Microsoft.KeyVault/vaults")["vault"])
    assert vault["properties"]["enableRbacAuthorization"] is True  # data roles, no access policies
    assert "accessPolicies" not in vault["properties"]
    external = Template(MAIN, {**REQUIRED, **SIZES[0], "consoleExternalIngress": True})
    console = _console(external)
    assert console is not None and console["properties"]["configuration"]["ingress"]["external"] is True
    assert _console(Template(MAIN, {**REQUIRED, **SIZES[0], "deployConsole": False})) is None


@pytest.mark.parametrize("allow_azure", [True, False], ids=["azure-services", "listed-only"])
def test_postgres_is_private_or_public_behind_firewall_rules(allow_azure: bool) -> None:
    """Private by default (a delegated subnet and a private DNS zone linked to the virtual network, no
    public access); public with postgresNetwork=public, admitting only the listed addresses (an AKS
    cluster's) and, unless switched off, Azure services (the Container Apps). Entra only either way,
    and the apps start after the rules exist."""

    def server(template: Template) -> dict[str, Any]:
        (found,) = template.instances(template.resources("Microsoft.DBforPostgreSQL/flexibleServers")["postgres"])
        return dict(found)

    def rules(template: Template) -> list[dict[str, Any]]:
        (declaration,) = template.resources("Microsoft.DBforPostgreSQL/flexibleServers/firewallRules").values()
        return template.instances(declaration)

    private = _template(SIZES[0])
    assert server(private)["properties"]["network"] == {
        "delegatedSubnetResourceId": f"{Ref('vnet.id')}/subnets/snet-postgres",
        "privateDnsZoneArmResourceId": Ref("postgresDns.id"),
        "publicNetworkAccess": "Disabled",
    }
    assert rules(private) == []
    for name in ("postgresDns", "postgresDnsLink"):
        (declaration,) = [d for n, d in private.doc["resources"].items() if n == name]
        assert len(private.instances(declaration)) == 1
    cluster = {"name": "aks-egress", "startIpAddress": "20.1.2.3", "endIpAddress": "20.1.2.3"}
    public = Template(
        MAIN,
        {
            **REQUIRED,
            **SIZES[0],
            "postgresNetwork": "public",
            "postgresFirewallRules": [cluster],
            "postgresAllowAzureServices": allow_azure,
        },
    )
    properties = server(public)["properties"]
    assert properties["network"] == {"publicNetworkAccess": "Enabled"}
    assert properties["authConfig"]["passwordAuth"] == "Disabled"
    expected = [{"startIpAddress": "0.0.0.0", "endIpAddress": "0.0.0.0"}] if allow_azure else []
    assert [r["properties"] for r in rules(public)] == [
        *expected,
        {"startIpAddress": "20.1.2.3", "endIpAddress": "20.1.2.3"},
    ]
    for name in ("postgresDns", "postgresDnsLink"):
        assert public.instances(public.doc["resources"][name]) == []
    (apps,) = [m for m in public.doc["modules"].values() if m["detail"]["path"] == "modules/app.bicep"]
    assert all(str(Ref("postgresFirewall")) in {str(d) for d in c["dependsOn"]} for c in public.instances(apps))
