"""Keyless authentication for tests, on 127.0.0.1: a certificate authority of the test's own, and
:class:`IdentityPlatform`, the token endpoints an Azure platform serves to its workloads.

- **Managed identity as Azure Container Apps serves it** (the App Service protocol, api-version
  2019-08-01): ``GET <IDENTITY_ENDPOINT>?api-version=2019-08-01&resource=...[&client_id=...]``
  with the ``X-IDENTITY-HEADER`` secret; answers ``access_token`` and ``expires_on``.
- **AKS workload identity**: the cluster's service account token in ``AZURE_FEDERATED_TOKEN_FILE``
  is exchanged at the Microsoft Entra token endpoint ``<AZURE_AUTHORITY_HOST>/<tenant>/oauth2/v2.0/token``
  (client credentials with a ``jwt-bearer`` client assertion), served over HTTPS as the SDK requires.

Both check what the real services check (the secret header, the api-version, the resource, the
client id, the federated token's signature, issuer and audience) and answer what they answer:
RS256 access tokens issued by ``https://sts.windows.net/<tenant>/`` for :attr:`IdentityPlatform.audience`
(Azurite with ``--oauth basic`` checks issuer, audience and lifetime, not the signature).
:attr:`IdentityPlatform.issued` counts the tokens given out by endpoint, :attr:`IdentityPlatform.refused`
says what was refused and why.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
import socket
import ssl
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import jwt
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from support.background import BackgroundLoop

STORAGE_AUDIENCE = "https://storage.azure.com"
TOKEN_EXCHANGE_AUDIENCE = "api://AzureADTokenExchange"  # a federated credential's audience
JWT_BEARER = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
CLUSTER_ISSUER = "https://oidc.cluster.test/"  # the cluster's service account issuer
SERVICE_ACCOUNT = "system:serviceaccount:billing:billing"


@dataclass(frozen=True)
class Certificates:
    """PEM files: ``authority`` is the test's CA (give it as ``SSL_CERT_FILE`` to the processes that
    must trust it); ``certificate`` and ``key`` are a server's, for its names and 127.0.0.1."""

    authority: Path
    certificate: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.certificate, self.key)
        return context


def make_certificates(directory: Path, names: Iterable[str] = ()) -> Certificates:
    """A new CA and a server certificate it signed for ``names`` and 127.0.0.1, valid for a day."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "billing test CA")])
    ca = (
        _builder(ca_name, ca_name, ca_key, now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign, crl_sign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    alternative = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), *(x509.DNSName(name) for name in names)]
    server = (
        _builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), ca_name, key, now)
        .add_extension(x509.SubjectAlternativeName(alternative), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    found = Certificates(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    found.authority.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    found.certificate.write_bytes(server.public_bytes(serialization.Encoding.PEM))
    found.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return found


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, now: dt.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
    )


class IdentityPlatform:
    """The managed identity endpoint (HTTP) and the Entra token endpoint (HTTPS) on 127.0.0.1, for
    one identity (``client_id`` in ``tenant``). Tokens it issues are for ``audience`` and live
    ``lifetime`` seconds (negative: already expired when issued). Use as a context manager; its
    sockets are bound on entry, in the entering thread's network namespace."""

    def __init__(
        self,
        certificates: Certificates,
        *,
        audience: str = STORAGE_AUDIENCE,
        lifetime: float = 3600,
        tenant: str | None = None,
        client_id: str | None = None,
    ) -> None:
        self.certificates = certificates
        self.audience = audience
        self.lifetime = lifetime
        self.tenant = tenant or str(uuid.uuid4())
        self.client_id = client_id or str(uuid.uuid4())
        self.issued: Counter[str] = Counter()  # tokens given out, by endpoint
        self.refused: list[str] = []  # requests refused, and why
        self._header = secrets.token_urlsafe(24)  # what IDENTITY_HEADER carries
        self._signing = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # Entra's key
        self._cluster = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # the cluster's
        self._sockets = {"managed_identity": socket.socket(), "entra": socket.socket()}
        self._background = BackgroundLoop("identity-platform")
        self._runner: web.AppRunner | None = None

    def container_apps_env(self) -> dict[str, str]:
        """What Container Apps sets for an app with this user-assigned identity (``AZURE_CLIENT_ID``
        is the app's own setting, choosing the identity)."""
        return {
            "IDENTITY_ENDPOINT": f"http://127.0.0.1:{self._port('managed_identity')}/msi/token",
            "IDENTITY_HEADER": self._header,
            "AZURE_CLIENT_ID": self.client_id,
        }

    def workload_identity_env(self, token_file: Path) -> dict[str, str]:
        """What the AKS workload identity webhook sets for a pod, with its service account token
        (issued by the cluster for the token exchange) projected into ``token_file``."""
        now = int(time.time())
        claims = {"iss": CLUSTER_ISSUER, "sub": SERVICE_ACCOUNT, "aud": [TOKEN_EXCHANGE_AUDIENCE]}
        token_file.write_text(jwt.encode({**claims, "iat": now, "nbf": now, "exp": now + 3600}, self._cluster, "RS256"))
        return {
            "AZURE_AUTHORITY_HOST": f"https://127.0.0.1:{self._port('entra')}/",
            "AZURE_TENANT_ID": self.tenant,
            "AZURE_CLIENT_ID": self.client_id,
            "AZURE_FEDERATED_TOKEN_FILE": str(token_file),
        }

    def __enter__(self) -> IdentityPlatform:
        for sock in self._sockets.values():
            sock.bind(("127.0.0.1", 0))
        self._background.__enter__()
        self._background.run(self._start())
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._runner is not None:
            self._background.run(self._runner.cleanup())
        self._background.__exit__(exc_type, exc, tb)

    def _port(self, endpoint: str) -> int:
        return int(self._sockets[endpoint].getsockname()[1])

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/msi/token", self._managed_identity)
        app.router.add_post("/{tenant}/oauth2/v2.0/token", self._entra)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sockets["managed_identity"]).start()
        context = self.certificates.server_context()
        await web.SockSite(self._runner, self._sockets["entra"], ssl_context=context).start()

    def _refuse(self, status: int, error: str, why: str) -> web.Response:
        self.refused.append(why)
        return web.json_response({"error": error, "error_description": why}, status=status)

    def _access_token(self, endpoint: str) -> tuple[str, int]:
        """A signed access token for the identity and its expiry (epoch seconds)."""
        now = int(time.time())
        expires = int(now + self.lifetime)
        claims = {
            "aud": self.audience,
            "iss": f"https://sts.windows.net/{self.tenant}/",
            "iat": min(now, expires - 60),
            "nbf": min(now, expires - 60),
            "exp": expires,
            "appid": self.client_id,
            "oid": str(uuid.uuid5(uuid.NAMESPACE_URL, self.client_id)),
            "tid": self.tenant,
            "sub": self.client_id,
            "ver": "1.0",
        }
        self.issued[endpoint] += 1
        return jwt.encode(claims, self._signing, "RS256", headers={"kid": "test"}), expires

    async def _managed_identity(self, request: web.Request) -> web.Response:
        query = request.query
        if request.headers.get("X-IDENTITY-HEADER") != self._header:
            return self._refuse(401, "unauthorized", "managed identity: missing or wrong X-IDENTITY-HEADER")
        if query.get("api-version") != "2019-08-01":
            return self._refuse(400, "invalid_request", f"managed identity: api-version {query.get('api-version')}")
        if query.get("client_id", self.client_id) != self.client_id:
            return self._refuse(400, "invalid_request", "managed identity: no such identity on this app")
        resource = query.get("resource", "")
        if not resource:
            return self._refuse(400, "invalid_request", "managed identity: no resource")
        token, expires = self._access_token("managed_identity")
        return web.json_response(
            {
                "access_token": token,
                "expires_on": str(expires),
                "resource": resource,
                "token_type": "Bearer",
                "client_id": self.client_id,
            }
        )

    async def _entra(self, request: web.Request) -> web.Response:
        form = await request.post()
        if request.match_info["tenant"] != self.tenant:
            return self._refuse(400, "invalid_request", f"entra: unknown tenant {request.match_info['tenant']}")
        if form.get("grant_type") != "client_credentials" or form.get("client_assertion_type") != JWT_BEARER:
            return self._refuse(400, "unsupported_grant_type", "entra: not a client assertion grant")
        if form.get("client_id") != self.client_id:
            return self._refuse(400, "unauthorized_client", "entra: unknown client id")
        try:
            federated = jwt.decode(
                str(form.get("client_assertion", "")),
                self._cluster.public_key(),
                algorithms=["RS256"],
                audience=TOKEN_EXCHANGE_AUDIENCE,
                issuer=CLUSTER_ISSUER,
                options={"require": ["exp", "iss", "sub", "aud"]},
            )
        except jwt.InvalidTokenError as exc:
            return self._refuse(401, "invalid_client", f"entra: federated token refused: {exc}")
        if federated["sub"] != SERVICE_ACCOUNT:
            return self._refuse(401, "invalid_client", f"entra: no federated credential for {federated['sub']}")
        if not str(form.get("scope", "")).endswith("/.default"):
            return self._refuse(400, "invalid_scope", f"entra: scope {form.get('scope')}")
        token, expires = self._access_token("entra")
        return web.json_response(
            {"access_token": token, "expires_in": max(0, expires - int(time.time())), "token_type": "Bearer"}
        )
