"""Every storage call goes through :class:`Storage`: one set of clients per process, the SDK's
retry policy, and a request counter that sees each HTTP request the SDK puts on the wire."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ResourceExistsError
from azure.core.pipeline import PipelineRequest
from azure.core.pipeline.policies import SansIOHTTPPolicy
from azure.storage.blob.aio import BlobServiceClient, ContainerClient, ExponentialRetry
from azure.storage.queue.aio import QueueClient, QueueServiceClient

from ..errors import ConfigurationError
from ..settings import Settings, poison_queue_name
from . import tally
from .failover import Failover


def request_kind(service: str, method: str, url: str) -> str:
    """Name the kind of one storage request, e.g. ``queue.send`` or ``blob.get``."""
    parts = urlsplit(url)
    query = parts.query
    if service == "queue" and ("/messages" in parts.path):
        if method == "POST":
            return "queue.send"
        if method == "GET":
            return "queue.peek" if "peekonly=true" in query else "queue.receive"
        if method == "PUT":
            return "queue.update"
        return "queue.delete" if "popreceipt=" in query else "queue.clear"
    if "comp=metadata" in query or method == "HEAD" or "comp=properties" in query:
        return f"{service}.metadata"
    if "comp=list" in query:
        return f"{service}.list"
    if service == "queue" or "restype=container" in query:
        return f"{service}.admin"
    return {"GET": "blob.get", "PUT": "blob.put", "DELETE": "blob.delete"}.get(method, "blob.other")


def resource(url: str) -> str:
    """The queue or container a request addresses (``""`` for account-level requests)."""
    split = urlsplit(url)
    parts = split.path.strip("/").split("/")
    # Path-style endpoints (Azurite, IP addresses) put the account first: /<account>/<resource>/...
    if len(parts) > 1 and _path_style(split.hostname or ""):
        parts = parts[1:]
    return parts[0]


def _path_style(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class RequestCounter:
    """Counts of storage requests by kind and by queue/container, shared by all clients of one process."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.by_resource: Counter[str] = Counter()
        #: How many of the requests were made for a batch of messages (see :mod:`shared.messaging.tally`).
        self.attributed = 0

    def add(self, kind: str, resource: str) -> None:
        """Count one request of ``kind`` on ``resource`` (for clients without a pipeline policy)."""
        self.counts[kind] += 1
        self.by_resource[resource] += 1
        self.attributed += tally.record(kind)

    def policy(self, service: str) -> SansIOHTTPPolicy:  # type: ignore[type-arg]
        """A pipeline policy for one service's clients; it runs once per attempt (after retry)."""
        return _CountingPolicy(self, service)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def snapshot(self) -> dict[str, int]:
        """The counts so far, by kind, with a ``total``."""
        return {**dict(sorted(self.counts.items())), "total": self.total}


class _CountingPolicy(SansIOHTTPPolicy):  # type: ignore[type-arg]
    def __init__(self, counter: RequestCounter, service: str) -> None:
        self._counter = counter
        self._service = service

    def on_request(self, request: PipelineRequest) -> None:  # type: ignore[type-arg]
        http = request.http_request
        self._counter.add(request_kind(self._service, http.method, http.url), resource(http.url))


class _Retry(ExponentialRetry):
    """The SDK's exponential retry, except for a credential that gave no token: it has retried what
    can pass (its token endpoint's 5xx, 429) itself, and the storage SDK would otherwise retry the
    whole chain (instance metadata probe, developer tools) for every attempt."""

    def increment(self, settings: dict[str, Any], request: Any, response: Any = None, error: Any = None) -> bool:
        return not isinstance(error, ClientAuthenticationError) and bool(
            super().increment(settings, request, response, error)
        )


class Storage:
    """The process's storage account: queue and blob clients, retries, request counting.

    Use as ``async with Storage(settings) as storage``; clients are created once and closed
    on exit. With ``storage_connection_string`` the account is used as it is; with
    ``storage_account_url`` the credential is ``DefaultAzureCredential``.
    """

    def __init__(self, settings: Settings, *, counter: RequestCounter | None = None, secondary: bool = False) -> None:
        self.settings = settings
        self.counter = counter or RequestCounter()
        self._credential: Any = None
        self._queues: dict[str, QueueClient] = {}
        self._containers: dict[str, ContainerClient] = {}
        conn = settings.secondary_storage_connection_string if secondary else settings.storage_connection_string
        url = settings.secondary_storage_account_url if secondary else settings.storage_account_url
        if conn is not None:
            secret = conn.get_secret_value()
            self.queue_service = QueueServiceClient.from_connection_string(secret, **self._client_options("queue"))
            self.blob_service = BlobServiceClient.from_connection_string(secret, **self._client_options("blob"))
        elif url:
            from azure.identity.aio import DefaultAzureCredential

            self._credential = DefaultAzureCredential()
            blob_url, queue_url = _service_urls(url)
            self.queue_service = QueueServiceClient(
                queue_url, credential=self._credential, **self._client_options("queue")
            )
            self.blob_service = BlobServiceClient(blob_url, credential=self._credential, **self._client_options("blob"))
        else:
            raise ConfigurationError(
                "no storage account: set BILLING_STORAGE_CONNECTION_STRING or "
                "BILLING_STORAGE_ACCOUNT_URL (or run `billing up` for the local stack)"
            )
        #: The secondary account and the routing of sends between the two, when one is configured.
        self.secondary: Storage | None = None
        self.failover: Failover | None = None
        if settings.has_secondary and not secondary:
            self.secondary = Storage(settings, counter=self.counter, secondary=True)
            self.failover = Failover(
                self,
                self.secondary,
                interval=settings.failover_interval,
                probe_interval=settings.failover_probe_interval,
                backlog_queues=settings.backlog_queues,
            )

    def _client_options(self, service: str) -> dict[str, Any]:
        """Options for one service client. Policies are pipeline nodes, so each client gets its own."""
        s = self.settings
        return {
            "_additional_pipeline_policies": [self.counter.policy(service)],
            "retry_policy": _Retry(
                initial_backoff=s.retry_backoff,  # type: ignore[arg-type]  # seconds; the SDK adds it to floats
                increment_base=2,
                retry_total=s.retry_total,
                # The SDK caps each kind of failure at 3 tries of its own unless told: the setting is the budget.
                retry_connect=s.retry_total,
                retry_read=s.retry_total,
                retry_status=s.retry_total,
                random_jitter_range=max(1, int(s.retry_backoff * 2)),
            ),
            "connection_timeout": min(10.0, s.request_timeout),
            "read_timeout": s.request_timeout,
        }

    @property
    def account_name(self) -> str:
        """The storage account's name (it identifies the account in triggers)."""
        return str(self.queue_service.account_name)

    def queue(self, name: str) -> QueueClient:
        """The (cached) client of one queue."""
        client = self._queues.get(name)
        if client is None:
            client = self._queues[name] = self.queue_service.get_queue_client(name)
        return client

    def container(self, name: str) -> ContainerClient:
        """The (cached) client of one blob container."""
        client = self._containers.get(name)
        if client is None:
            client = self._containers[name] = self.blob_service.get_container_client(name)
        return client

    async def ensure(self, *, queues: Iterable[str] = (), containers: Iterable[str] = ()) -> None:
        """Create queues and containers that do not exist yet: the first alone, then the rest at once
        (the first failure is raised). Credentials that cannot be used (a role's or ``billing submit``'s
        first request) raise :class:`ConfigurationError`, on one line, after one token request and
        one storage request."""

        async def create(make: Callable[[], Awaitable[object]]) -> None:
            with contextlib.suppress(ResourceExistsError):
                await make()

        makers: list[Callable[[], Awaitable[object]]] = [self.queue(name).create_queue for name in queues]
        makers += [self.container(name).create_container for name in containers]
        for group in (makers[:1], makers[1:]):
            for outcome in await asyncio.gather(*map(create, group), return_exceptions=True):
                if isinstance(outcome, HttpResponseError) and (
                    isinstance(outcome, ClientAuthenticationError) or outcome.status_code == 403
                ):
                    raise _refused(outcome) from outcome
                if isinstance(outcome, BaseException):
                    raise outcome

    async def ensure_all(self) -> None:
        """Create every queue and container the pipeline uses (and the secondary's backlog queues)."""
        s = self.settings
        await self.ensure(
            queues=[*s.all_queues, *s.poison_queues],
            containers=s.all_containers,
        )
        if self.secondary is not None:
            backlog = s.backlog_queues
            await self.secondary.ensure(
                queues=[*backlog, *map(poison_queue_name, backlog)], containers=[s.work_container]
            )

    async def send(self, queue: str, text: str) -> None:
        """Send a message to a pipeline queue (through the failover when a secondary is configured)."""
        if self.failover is None:
            await self.queue(queue).send_message(text)
        else:
            await self.failover.send(queue, text)

    async def upload_for(self, queue: str, container: str, name: str, data: bytes) -> bool:
        """Upload a blob that a message for ``queue`` refers to, into the account that queue's
        sends use now; returns whether that is the secondary."""

        async def upload(storage: Storage) -> None:
            await storage.container(container).upload_blob(name, data, overwrite=True)

        if self.failover is None or self.secondary is None:
            await upload(self)
            return False
        secondary = self.secondary
        _, failed_over = await self.failover.run(queue, lambda: upload(self), lambda: upload(secondary))
        return failed_over

    async def close(self) -> None:
        if self.secondary is not None:
            await self.secondary.close()
        for queue in self._queues.values():
            await queue.close()
        for container in self._containers.values():
            await container.close()
        await self.queue_service.close()
        await self.blob_service.close()
        if self._credential is not None:
            await self._credential.close()

    async def __aenter__(self) -> Storage:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _refused(exc: HttpResponseError) -> ConfigurationError:
    """Credentials the account refused, or no token to present, on one line: the service's error code
    and detail (``AuthenticationFailed: Invalid token audience.``), else the credential's own words."""
    code = getattr(exc, "error_code", None)  # set by the storage SDK: a StorageErrorCode (str) or None
    details = getattr(exc, "additional_info", None) or {}
    words = ": ".join([str(getattr(code, "value", code)), *map(str, details.values())]) if code else str(exc.message)
    why = " ".join(words.split())
    return ConfigurationError(f"the storage account cannot be used with these credentials (BILLING_STORAGE_*): {why}")


def _service_urls(account_url: str) -> tuple[str, str]:
    """Blob and queue endpoints from either one (``https://acct.blob.core.windows.net``)."""
    url = account_url.rstrip("/")
    if ".queue." in url:
        return url.replace(".queue.", ".blob."), url
    if ".blob." in url:
        return url, url.replace(".blob.", ".queue.")
    raise ConfigurationError(f"BILLING_STORAGE_ACCOUNT_URL must name a blob or queue endpoint: {url}")
