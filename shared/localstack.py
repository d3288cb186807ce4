"""The local stack: Azurite (the ``azurite`` npm package) for ``billing up``/``down``, the demo, the
tests, and a role started with no storage account configured (:func:`resolve`)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.errors import BillingError
from shared.messaging.processes import pid_alive

if TYPE_CHECKING:
    from shared.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
AZURITE_BIN = ROOT / "node_modules" / ".bin" / "azurite"
ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public; the same in every Azurite install).
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class StackError(BillingError):
    """The local stack cannot be started or stopped."""


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that are free on ``host`` right now."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]


def port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def is_azurite(pid: int) -> bool:
    """Whether ``pid`` is a live Azurite process (guards against a reused pid in a stale state file)."""
    if not pid_alive(pid):
        return False
    try:
        return b"azurite" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def connection_string(host: str, blob_port: int, queue_port: int, *, scheme: str = "http") -> str:
    """The Azurite connection string for the given endpoints."""
    return (
        f"DefaultEndpointsProtocol={scheme};AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
        f"BlobEndpoint={scheme}://{host}:{blob_port}/{ACCOUNT};QueueEndpoint={scheme}://{host}:{queue_port}/{ACCOUNT};"
    )


class AzuriteStack:
    """One Azurite process (blob, queue and table) whose state lives in ``home/azurite.json``.

    The process runs in its own session, so it outlives the command that started it; any
    ``AzuriteStack`` with the same ``home`` finds and reuses or stops it.
    """

    def __init__(
        self,
        *,
        home: Path,
        host: str = "127.0.0.1",
        blob_port: int | None = None,
        queue_port: int | None = None,
        persist: bool = True,
        debug_log: Path | None = None,
        timeout: float = 60.0,
        https: tuple[Path, Path] | None = None,
    ) -> None:
        self.home = Path(home)
        # (certificate, key) PEM files: serve HTTPS with them and accept OAuth bearer tokens too
        # (``--oauth basic``: issuer, audience and lifetime checked, as the tests need; not the signature).
        self.https = https
        self.debug_log = debug_log  # Azurite's own log of every request it receives
        self.host = host
        self.blob_port = blob_port
        self.queue_port = queue_port
        self.persist = persist
        self.timeout = timeout
        self.state_file = self.home / "azurite.json"
        self.log_file = self.home / "azurite.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Start Azurite unless it already runs; return its connection string."""
        with self._locked():
            state = self._live_state()
            if state is not None:
                return str(state["connection_string"])
            self._stop_locked()
            if not AZURITE_BIN.exists():
                raise StackError(f"Azurite is not installed ({AZURITE_BIN} is missing): run `npm ci` in {ROOT}")
            blob, queue, table = self._ports()
            args = self._command(blob, queue, table)
            with self.log_file.open("ab") as log:
                log_offset = log.tell()
                self._proc = subprocess.Popen(
                    args,
                    cwd=ROOT,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            connection = connection_string(self.host, blob, queue, scheme=self.scheme)
            self._write_state(
                {
                    "pid": self._proc.pid,
                    "host": self.host,
                    "blob_port": blob,
                    "queue_port": queue,
                    "table_port": table,
                    "connection_string": connection,
                }
            )
            self._wait_ready(self._proc.pid, (blob, queue), log_offset)
            return connection

    def _command(self, blob: int, queue: int, table: int) -> list[str]:
        """Azurite's command line for these ports and this stack's options."""
        args = [
            str(AZURITE_BIN),
            "--blobHost",
            self.host,
            "--blobPort",
            str(blob),
            "--queueHost",
            self.host,
            "--queuePort",
            str(queue),
            "--tableHost",
            self.host,
            "--tablePort",
            str(table),
            "--skipApiVersionCheck",
            "--loose",
            "--silent",
            "--disableTelemetry",
        ]
        if self.persist:
            data = self.home / "azurite"
            data.mkdir(parents=True, exist_ok=True)
            args += ["--location", str(data)]
        else:
            args.append("--inMemoryPersistence")
        if self.debug_log is not None:
            args += ["--debug", str(self.debug_log)]
        if self.https is not None:
            args += ["--cert", str(self.https[0]), "--key", str(self.https[1]), "--oauth", "basic"]
        return args

    def stop(self) -> None:
        """Stop Azurite (SIGTERM to its process group, SIGKILL after 10 s) and forget it; idempotent."""
        with self._locked():
            self._stop_locked()

    def restart(self, *, down_for: float = 0.0) -> str:
        """Stop, stay down ``down_for`` seconds, start again on the same ports (the data survives when
        persisted), so clients keep their connection string across the outage; returns it."""
        state = self._read_state()
        self.stop()
        time.sleep(down_for)
        if state is not None:
            self.blob_port, self.queue_port = int(str(state["blob_port"])), int(str(state["queue_port"]))
        return self.start()

    def running(self) -> bool:
        """Whether the process named by the state file is alive with both ports open."""
        return self._live_state() is not None

    def connection_string(self) -> str | None:
        """The running stack's connection string, or ``None``."""
        state = self._live_state()
        return None if state is None else str(state["connection_string"])

    @property
    def scheme(self) -> str:
        return "http" if self.https is None else "https"

    @property
    def pid(self) -> int | None:
        """The running Azurite's process id, or ``None``."""
        state = self._live_state()
        return None if state is None else int(str(state["pid"]))

    def _ports(self) -> tuple[int, int, int]:
        wanted = [self.blob_port, self.queue_port]
        spare = iter(p for p in free_ports(3, self.host) if p not in wanted)
        blob, queue = (port if port is not None else next(spare) for port in wanted)
        return blob, queue, next(spare)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise start/stop between processes sharing ``home``."""
        self.home.mkdir(parents=True, exist_ok=True)
        with (self.home / "azurite.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _read_state(self) -> dict[str, object] | None:
        try:
            return dict(json.loads(self.state_file.read_text()))
        except (OSError, ValueError):
            return None

    def _write_state(self, state: dict[str, object]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)

    def _live_state(self) -> dict[str, object] | None:
        state = self._read_state()
        if state is None or not is_azurite(int(str(state["pid"]))):
            return None
        host = str(state["host"])
        if all(port_open(host, int(str(state[key]))) for key in ("blob_port", "queue_port")):
            return state
        return None

    def _wait_ready(self, pid: int, ports: tuple[int, ...], log_offset: int) -> None:
        """Wait until Azurite says it listens on ``ports`` and they accept connections (a port that
        accepts alone may belong to another process that Azurite is about to collide with)."""
        deadline = time.monotonic() + self.timeout
        while not self._listening(ports, log_offset):
            if not pid_alive(pid):
                self._stop_locked()
                lines = self.log_file.read_text(errors="replace").strip().splitlines() or [""]
                raise StackError(f"Azurite exited during start-up ({lines[-1]}); see {self.log_file}")
            if time.monotonic() > deadline:
                self._stop_locked()
                raise StackError(f"Azurite did not open ports {ports} within {self.timeout:.0f} s; see {self.log_file}")
            time.sleep(0.1)

    def _listening(self, ports: tuple[int, ...], log_offset: int) -> bool:
        with self.log_file.open("rb") as log:
            log.seek(log_offset)
            text = log.read().decode(errors="replace")
        said = all(f"successfully listening at {self.scheme}://{self.host}:{port}" in text for port in ports)
        return said and all(port_open(self.host, port) for port in ports)

    def _stop_locked(self) -> None:
        state = self._read_state()
        if state is not None:
            pid = int(str(state["pid"]))
            if is_azurite(pid):
                self._terminate(pid)
            self.state_file.unlink(missing_ok=True)
        if self._proc is not None:
            self._proc.wait()
            self._proc = None

    def _terminate(self, pid: int) -> None:
        for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + grace
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not pid_alive(pid):
                return
        raise StackError(f"Azurite (pid {pid}) did not stop")


def resolve(settings: Settings | None = None, **overrides: Any) -> Settings:
    """Settings with a storage account: the configured one, or the local stack (started if needed)."""
    from pydantic import SecretStr

    from shared.settings import Settings  # here: the command line imports this module for its help too

    settings = settings or Settings()
    if overrides:
        settings = settings.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    if settings.storage_connection_string is None and not settings.storage_account_url:
        connection = AzuriteStack(home=settings.home).start()
        settings = settings.model_copy(update={"storage_connection_string": SecretStr(connection)})
    return settings
