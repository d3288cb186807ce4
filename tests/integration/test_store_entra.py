"""The store logs in to PostgreSQL keylessly, as on Azure: the password of each new connection is a
Microsoft Entra token from the credential, for the Azure Database for PostgreSQL scope.

No Entra here: the token comes from the managed identity endpoint of :class:`IdentityPlatform` on
127.0.0.1 (the protocol Container Apps serves), and the local PostgreSQL plays Azure's part by
accepting exactly that token as the role's password (Azure checks the token's signature instead).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from azure.identity import ManagedIdentityCredential

from benchmarks.postgres import PostgresServer
from shared.errors import InfrastructureError
from store import ENTRA_POSTGRES_SCOPE, Store
from support.identity import IdentityPlatform, make_certificates

pytestmark = pytest.mark.postgres

ROLE = "billing_identity"


@pytest.fixture
def platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[IdentityPlatform]:
    audience = ENTRA_POSTGRES_SCOPE.removesuffix("/.default")
    with IdentityPlatform(make_certificates(tmp_path / "ca"), audience=audience) as p:
        for name, value in p.container_apps_env().items():
            monkeypatch.setenv(name, value)
        yield p


@pytest.fixture
def identity_login(postgres_server: PostgresServer) -> Iterator[tuple[str, sa.Engine]]:
    """A database owned by :data:`ROLE`, which must log in with a password (scram) even here."""
    admin = sa.create_engine(postgres_server.url, isolation_level="AUTOCOMMIT")
    database = f"entra_{uuid.uuid4().hex[:12]}"
    hba = postgres_server.data_dir / "pg_hba.conf"
    rules = hba.read_text()
    hba.write_text(f"host all {ROLE} 127.0.0.1/32 scram-sha-256\n{rules}")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP ROLE IF EXISTS {ROLE}")
        conn.exec_driver_sql(f"CREATE ROLE {ROLE} LOGIN")
        conn.exec_driver_sql(f'CREATE DATABASE "{database}" OWNER {ROLE}')
        conn.exec_driver_sql("SELECT pg_reload_conf()")
    try:
        yield f"postgresql://{ROLE}@127.0.0.1:{postgres_server.port}/{database}", admin
    finally:
        hba.write_text(rules)
        with admin.connect() as conn:
            conn.exec_driver_sql("SELECT pg_reload_conf()")
            conn.exec_driver_sql(f'DROP DATABASE "{database}" WITH (FORCE)')
            conn.exec_driver_sql(f"DROP ROLE {ROLE}")
        admin.dispose()


def test_the_store_logs_in_with_an_entra_token(
    platform: IdentityPlatform, identity_login: tuple[str, sa.Engine]
) -> None:
    url, admin = identity_login
    credential = ManagedIdentityCredential(client_id=platform.client_id)
    token = credential.get_token(ENTRA_POSTGRES_SCOPE).token
    with admin.connect() as conn:
        conn.exec_driver_sql(f"ALTER ROLE {ROLE} PASSWORD '{token}'")  # DDL takes no parameters; a JWT has no quote

    with pytest.raises(InfrastructureError, match="no password supplied"):
        Store(url)  # no password and no credential: refused
    with Store(url, credential=credential) as store:  # migrates: the role owns the database
        assert store.batches() == []
        store.engine.dispose()
        assert store.batches() == [], "a new connection logs in again"
    assert platform.issued["managed_identity"] == 1, "the token is cached until near its expiry"
    assert platform.refused == []
