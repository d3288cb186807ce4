"""No secret in any log line, error message or command output.

Azurite runs with an account of its own whose key is random and real-looking (``AZURITE_ACCOUNTS``).
The three roles run a batch fed by ``billing submit --wait``; ``status``, ``report``, ``poison list``
and ``billing up`` (with a password in the SQL URL) run too; then failing commands: a wrong account
key, a forged SAS signature, an unreachable SQL server with a password. Every log file and every
stdout/stderr is searched for the key, the wrong key, the signature, the password and the
connection strings, and for any unredacted ``AccountKey=``, ``sig=`` or URL password. The status that cannot reach
its SQL server says it waits (the URL in that line too) for 2 s, not the default two minutes."""

from __future__ import annotations

import base64
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from pydantic import SecretStr

from billing.sample import generate
from shared.localstack import free_ports
from shared.settings import Settings
from support.azurite import running_azurite
from support.references import sample_flags
from support.roles import Roles

ACCOUNT = "billingprod"
BATCH = "secret-run"


def account_connection(azurite: str, key: str) -> str:
    """The Azurite connection string rewritten for ``ACCOUNT`` with ``key``."""
    endpoints = re.findall(r"(Blob|Queue)Endpoint=(http://[^/;]+)/", azurite)
    return f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};" + "".join(
        f"{service}Endpoint={base}/{ACCOUNT};" for service, base in endpoints
    )


def billing(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "billing", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_no_secret_reaches_logs_errors_or_output(
    settings_env: Settings, roles: Roles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, wrong_key = (base64.b64encode(os.urandom(64)).decode() for _ in range(2))
    signature = base64.b64encode(os.urandom(32)).decode()
    password = secrets.token_urlsafe(18)
    monkeypatch.setenv("AZURITE_ACCOUNTS", f"{ACCOUNT}:{key}")
    with running_azurite(tmp_path / "azurite", persist=False) as stack:
        connection = account_connection(stack.connection_string() or "", key)
        sas = f"sv=2021-08-06&ss=bq&srt=sco&sp=rwdlacup&se=2099-01-01T00:00:00Z&sig={quote(signature, safe='')}"
        forged = re.sub(r"AccountKey=[^;]+;", f"SharedAccessSignature={sas};", connection)
        (closed_port,) = free_ports(1)
        sql_with_password = f"postgresql+psycopg://billing:{password}@127.0.0.1:{closed_port}/billing"
        settings = settings_env.model_copy(update={"storage_connection_string": SecretStr(connection)})
        env = {**os.environ, **settings.as_env(), "BILLING_TRIGGER_BACKEND": "local"}
        batch = tmp_path / "batch.csv"
        generate(2_000, batch, seed=9, reject_rate=0.05)

        outputs: list[str] = []
        with roles.running(settings):
            for args in (
                (
                    "-v",
                    "submit",
                    str(batch),
                    "--batch-id",
                    BATCH,
                    "--wait",
                    "--timeout",
                    "120",
                    *sample_flags(tmp_path / "ref"),
                ),
                ("status",),
                ("status", "--json"),
                ("status", BATCH, "--json"),
                ("report", "rejects", "--batch", BATCH),
                ("poison", "list"),
            ):
                done = billing(env, *args)
                assert done.returncode == 0, done.stderr
                outputs += [done.stdout, done.stderr]
        assert roles.returncodes == [0, 0, 0]
        local = {**env, "BILLING_HOME": str(tmp_path / "local"), "BILLING_SQL_URL": sql_with_password}
        up = billing(local, "up")
        billing(local, "down")
        assert up.returncode == 0 and "BILLING_SQL_URL=" in up.stdout, up.stderr
        outputs += [up.stdout, up.stderr]
        refused = [
            billing(
                {**env, "BILLING_STORAGE_CONNECTION_STRING": connection.replace(key, wrong_key)},
                "submit",
                str(batch),
                *sample_flags(tmp_path / "ref"),
            ),
            billing(
                {**env, "BILLING_STORAGE_CONNECTION_STRING": connection.replace(key, wrong_key)},
                "-v",
                "processor",
                "--burst",
            ),
            billing(
                {**env, "BILLING_STORAGE_CONNECTION_STRING": forged},
                "-v",
                "submit",
                str(batch),
                *sample_flags(tmp_path / "ref"),
            ),
            billing({**env, "BILLING_SQL_URL": sql_with_password, "BILLING_STORE_PATIENCE": "2"}, "-v", "status"),
        ]
    for done in refused:
        assert done.returncode != 0, f"a wrong credential is refused: {done.args}"
        outputs += [done.stdout, done.stderr]
    logs = list((tmp_path / "logs").glob("*.log"))
    assert len(logs) == 3
    outputs += [log.read_text(errors="replace") for log in logs]

    everything = "\n".join(outputs)
    assert BATCH in everything and "complete" in everything, "the run itself happened"
    assert "AuthenticationFailed" in everything or "authenticate" in everything, "the refusals say why"
    for secret in (
        key,
        wrong_key,
        signature,
        quote(signature, safe=""),
        password,
        connection,
        forged,
        sas,
        key[:16],
        wrong_key[:16],
    ):
        assert secret not in everything
    assert not re.search(r"AccountKey=(?!\*\*\*)", everything), "an unredacted AccountKey"
    assert not re.search(r"sig=(?!\*\*\*)", everything), "an unredacted SAS signature"
    assert not re.search(r"://[^/@\s:]+:(?!\*\*\*)[^/@\s]+@", everything), "an unredacted password in a URL"
