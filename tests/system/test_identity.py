"""Keyless storage end to end, as on Azure: the three roles and ``billing`` run with
``BILLING_STORAGE_ACCOUNT_URL`` and no key anywhere, and authenticate through
``DefaultAzureCredential`` with what the platform gives a workload:

- **Azure Container Apps** (user-assigned managed identity): ``IDENTITY_ENDPOINT`` /
  ``IDENTITY_HEADER`` and the App Service token protocol (api-version 2019-08-01);
- **AKS workload identity**: ``AZURE_FEDERATED_TOKEN_FILE``, ``AZURE_CLIENT_ID``,
  ``AZURE_TENANT_ID`` and ``AZURE_AUTHORITY_HOST``, the federated token exchanged at the Entra
  token endpoint.

What is real: Azurite, over HTTPS with a certificate from the test's own CA (trusted through
``SSL_CERT_FILE``, as a custom CA is trusted on a node), with OAuth on (``--oauth basic``: it
checks each bearer token's issuer, audience and lifetime, not its signature); the roles, the CLI,
the SDK and its credential chain, untouched. What stands in, at the wire boundary, because it
cannot run here: the platform's token endpoints (``support.identity.IdentityPlatform``, which
checks what the real ones check), and name resolution: the account's real endpoint names
(``https://devstoreaccount1.blob.core.windows.net``) reach Azurite through an HTTPS proxy on
127.0.0.1 (``HTTPS_PROXY``, honoured by the SDK; ``support.tunnel``) that relays TLS unopened.

Nothing can reach any address but 127.0.0.0/8: Azurite, the endpoints, the roles and the CLI all
run in a network namespace the test makes with ``lo`` as its only interface, so the kernel refuses
a route anywhere else (the instance metadata address included) - asserted, with every process's
namespace checked. A token for the wrong audience, or one already expired, stops every role at
once with exit code 2 and one line saying why, after a bounded number of token and storage requests.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from billing.demo import start_role
from billing.sample import generate
from shared.localstack import AzuriteStack
from shared.settings import Settings
from support.azurite import running_azurite, service_ports
from support.exact import billing_process, expected, read_raw, report, sorted_records
from support.identity import IdentityPlatform, make_certificates
from support.netns import NamespaceRefused, loopback_only, namespace_of, unreachable
from support.references import sample_flags
from support.roles import Roles
from support.tunnel import TunnelProxy

pytestmark = pytest.mark.usefixtures("settings_env")

ACCOUNT = "devstoreaccount1"
BLOB, QUEUE = (f"{ACCOUNT}.{service}.core.windows.net" for service in ("blob", "queue"))
PLATFORMS = ("container-apps", "workload-identity")
#: The caller's own credentials, proxies and platform variables: none may leak into the test.
FOREIGN = ("AZURE_", "IDENTITY_", "MSI_", "IMDS_", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
#: Azurite's debug log: one line per request that carried a bearer token, one per shared-key match.
TOKEN_CHECKED = "TokenAuthenticator:validate() Start validation against token authentication."
TOKEN_ACCEPTED = "TokenAuthenticator:authenticateBasic() Validation against token authentication successfully."
KEY_MATCHED = re.compile(r"SharedKeyAuthenticator:validate\(\) Signature \d matched")


@dataclass
class Keyless:
    """A test's keyless account: Azurite behind its endpoint names, and the identity platform."""

    azurite: AzuriteStack
    platform: IdentityPlatform
    proxy: TunnelProxy
    namespace: str
    debug_log: Path

    def azurite_log(self) -> str:
        return self.debug_log.read_text(errors="replace")


@contextmanager
def keyless(
    platform_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **platform_options: Any
) -> Iterator[Keyless]:
    """Inside a loopback-only network namespace: Azurite over HTTPS with OAuth, the identity
    platform, the proxy resolving the account's names; the environment set as ``platform_name``
    sets it (and ``BILLING_STORAGE_ACCOUNT_URL``, no connection string) for every process started."""
    certificates = make_certificates(tmp_path / "tls", [BLOB, QUEUE])
    debug_log = tmp_path / "azurite-debug.log"
    with ExitStack() as stack:
        try:
            namespace = stack.enter_context(loopback_only())
        except NamespaceRefused as exc:
            message = f"{exc} (the identity tests run in a network namespace of their own; needs root)"
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        azurite = stack.enter_context(
            running_azurite(tmp_path / "azurite", persist=False, debug_log=debug_log, https=certificates)
        )
        platform = stack.enter_context(IdentityPlatform(certificates, **platform_options))
        ports = service_ports(azurite)
        proxy = stack.enter_context(TunnelProxy({f"{BLOB}:443": ports["blob"], f"{QUEUE}:443": ports["queue"]}))

        for name in [k for k in os.environ if k.upper().startswith(FOREIGN)]:
            monkeypatch.delenv(name)
        monkeypatch.delenv("BILLING_STORAGE_CONNECTION_STRING")
        identity = {}  # no identity: the platform sets nothing
        if platform_name == "container-apps":
            identity = platform.container_apps_env()
        elif platform_name == "workload-identity":
            identity = platform.workload_identity_env(tmp_path / "azure-identity-token")
        for name, value in {
            "BILLING_STORAGE_ACCOUNT_URL": f"https://{BLOB}",
            "BILLING_TRIGGER_BACKEND": "local",
            "HTTPS_PROXY": proxy.url,
            "NO_PROXY": "127.0.0.1",  # the token endpoints are reached directly
            "SSL_CERT_FILE": str(certificates.authority),
            **identity,
        }.items():
            monkeypatch.setenv(name, value)
        yield Keyless(azurite, platform, proxy, namespace, debug_log)


@pytest.fixture
def roles(roles: Roles) -> Roles:
    """Roles as new interpreters, not forks: each must start inside the test's network namespace
    with the environment the platform sets, which is what these tests read from ``/proc``."""
    roles.start = start_role
    return roles


def assert_isolated(setup: Keyless, pids: list[int]) -> None:
    """Only loopback exists where the test and ``pids`` run: no interface but ``lo``, no route to
    the instance metadata service or anywhere else outside 127.0.0.0/8."""
    assert socket.if_nameindex() == [(1, "lo")]
    assert unreachable("169.254.169.254"), "instance metadata must be unroutable, not merely silent"
    assert unreachable("20.60.0.1", 443), "a public address (an Azure storage front end) must be unroutable"
    assert setup.azurite.pid is not None
    assert {namespace_of(pid) for pid in [*pids, setup.azurite.pid]} == {setup.namespace}


def environment_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode(errors="replace").split("=", 1) for entry in raw if b"=" in entry)


@pytest.mark.parametrize("platform_name", PLATFORMS)
def test_a_batch_runs_exact_with_the_platform_identity_and_no_key(
    platform_name: str, roles: Roles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch, batch_id = tmp_path / "batch.csv", f"keyless-{platform_name}"
    generate(2_000, batch, seed=14, reject_rate=0.05)

    with keyless(platform_name, tmp_path, monkeypatch) as setup, roles.running(Settings()) as processes:
        assert roles.wait_up(), roles.logs()
        pids = [process.pid for process in processes]
        assert_isolated(setup, pids)
        for pid in pids:
            env = environment_of(pid)
            assert "BILLING_STORAGE_CONNECTION_STRING" not in env and env["BILLING_STORAGE_ACCOUNT_URL"]
            assert not any("AccountKey" in value or "SharedAccessSignature" in value for value in env.values())
        billing_process(
            "submit", str(batch), "--batch-id", batch_id, "--wait", "--timeout", "240", *sample_flags(tmp_path / "ref")
        )
        aggregates, invoices, rejects = expected(read_raw(batch))
        got = [{**record, "quantity": Decimal(record["quantity"])} for record in report("aggregates", batch_id)]
        assert sorted_records(got) == aggregates
        assert sorted_records(report("invoices", batch_id)) == invoices
        assert [{"row": r["row"], "reason": r["reason"]} for r in report("rejects", batch_id)] == rejects
    assert roles.returncodes == [0, 0, 0], roles.logs()

    endpoint = "managed_identity" if platform_name == "container-apps" else "entra"
    assert setup.platform.refused == []
    log = setup.azurite_log()
    requests = log.count(TOKEN_ACCEPTED)
    assert requests > 100, "every storage request was made with a bearer token"
    # Tokens are kept while valid: at most one per service client (queue, blob) of each process
    # (the three roles, submit and the three reports), not one per request.
    assert set(setup.platform.issued) == {endpoint} and 4 <= setup.platform.issued[endpoint] <= 2 * 7 < requests
    assert set(setup.proxy.asked) == {f"{BLOB}:443", f"{QUEUE}:443"}, "only the account's endpoints"
    assert not KEY_MATCHED.search(log), "no request was signed with a key"


@pytest.mark.parametrize(
    ("platform_name", "token", "reason"),
    [
        pytest.param("container-apps", {"audience": "https://management.azure.com"}, "Invalid token audience"),
        pytest.param("workload-identity", {"lifetime": -600}, "The token is expired"),
    ],
    ids=["wrong-audience", "expired-token"],
)
def test_a_refused_token_stops_each_role_with_one_clear_line_and_no_retry_storm(
    platform_name: str,
    token: dict[str, Any],
    reason: str,
    roles: Roles,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = tmp_path / "batch.csv"
    generate(100, batch, seed=14)
    with keyless(platform_name, tmp_path, monkeypatch, **token) as setup:
        with roles.running(Settings()) as processes:
            assert_isolated(setup, [process.pid for process in processes])
            codes = roles.wait(timeout=120)
        submit = subprocess.run(
            [sys.executable, "-m", "billing", "submit", str(batch), *sample_flags(tmp_path / "ref")],
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert codes == [2, 2, 2], roles.logs()
    outputs = [*roles.logs().values(), submit.stderr]
    assert submit.returncode == 2, submit.stderr
    for output in outputs:
        said = [line for line in output.splitlines() if reason in line]
        assert len(said) == 1, output  # one line, naming the refusal
        assert "error" in said[0] and "BILLING_STORAGE" in said[0], said[0]
        assert "Traceback" not in output
    # No retry storm: each of the four processes asked for one token and made one request, refused.
    assert sum(setup.platform.issued.values()) == 4
    assert setup.azurite_log().count(TOKEN_CHECKED) == 4
    assert setup.azurite_log().count(TOKEN_ACCEPTED) == 0


DEVELOPER_TOOL = """#!/bin/sh
echo "$(basename "$0") $*" >> {ran}
echo "ERROR: Please run 'az login' to setup account." >&2
exit 1
"""


@pytest.mark.parametrize("token_credentials", ["prod", ""], ids=["AZURE_TOKEN_CREDENTIALS=prod", "default-chain"])
def test_without_an_identity_each_role_stops_with_one_clear_line(
    token_credentials: str, roles: Roles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No identity on the platform: the chain tries the environment, workload identity and managed
    identity (the instance metadata endpoint, unroutable here) once and fails; every role stops with
    one line. With ``AZURE_TOKEN_CREDENTIALS=prod`` (what a deployment sets) no developer tool is run;
    the default chain runs them (here, stand-ins on ``PATH`` that record being run)."""
    tools, ran = tmp_path / "bin", tmp_path / "tools-run.log"
    tools.mkdir()
    for tool in ("az", "pwsh", "azd"):
        (tools / tool).write_text(DEVELOPER_TOOL.format(ran=ran))
        (tools / tool).chmod(0o755)
    with keyless("none", tmp_path, monkeypatch) as setup:
        monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("AZURE_TOKEN_CREDENTIALS", token_credentials)
        with roles.running(Settings()) as processes:
            assert_isolated(setup, [process.pid for process in processes])
            codes = roles.wait(timeout=120)

    assert codes == [2, 2, 2], roles.logs()
    for output in roles.logs().values():
        said = [line for line in output.splitlines() if "BILLING_STORAGE" in line]
        assert len(said) == 1 and "Traceback" not in output, output
        assert "DefaultAzureCredential failed to retrieve a token" in said[0] and "ManagedIdentityCredential" in said[0]
    assert setup.platform.issued == {} and setup.azurite_log().count(TOKEN_CHECKED) == 0, "no request left"
    tools_run = ran.read_text().splitlines() if ran.exists() else []
    if token_credentials == "prod":
        assert tools_run == []
    else:
        # The default chain runs the Azure CLI, once per role: a chain that gave no token is not retried.
        assert sum(line.startswith("az ") for line in tools_run) == 3, tools_run
