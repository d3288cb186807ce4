"""A throwaway local PostgreSQL server, from the machine's Debian packages (``bash deploy/install-postgres.sh``),
for ``billing soak --store postgresql`` and the tests."""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from shared.localstack import StackError, free_ports


class PostgresNotInstalled(StackError):
    """No ``initdb``/``pg_ctl`` on this machine."""


def postgres_bin_dir() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl``: the newest ``/usr/lib/postgresql/*/bin``, else ``PATH``."""
    versions = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb") if p.with_name("pg_ctl").exists()]
    if versions:
        return max(versions, key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.name)] or [0])
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb and shutil.which("pg_ctl") else None


class PostgresServer:
    """A PostgreSQL cluster in ``data_dir``: trust auth, TCP on 127.0.0.1 only, fsync off.

    As root the cluster is owned by and run as the ``postgres`` user, so every parent of
    ``data_dir`` must be traversable by that user (``/tmp/<mkdtemp>`` is; pytest's ``tmp_path`` is not).
    """

    def __init__(self, *, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port
        self.socket_dir = self.data_dir / "sockets"
        self.log_file = self.data_dir / "postgres.log"
        self._bin: Path | None = None

    def start(self) -> str:
        """Create the cluster if needed, start it and return its SQLAlchemy URL."""
        if self.port is None:
            self.port = free_ports(1)[0]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not (self.data_dir / "PG_VERSION").exists():
            self._chown()
            self._run(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            )
        self.socket_dir.mkdir(exist_ok=True)
        self._chown()
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.socket_dir} -c fsync=off"
        try:
            self._run(
                "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60", "-o", options, "start"
            )
        except StackError as exc:
            log = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            raise StackError(f"{exc}\n{self.log_file}:\n{log}") from exc
        return self.url

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the ``postgres`` database (once started)."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        """Stop the server (fast shutdown); idempotent."""
        if (self.data_dir / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")

    def _chown(self) -> None:
        if os.geteuid() != 0:
            return
        try:
            user = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise StackError("running as root needs a `postgres` user: run `bash deploy/install-postgres.sh`") from exc
        for path in [self.data_dir, *self.data_dir.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)

    def _run(self, tool: str, *args: str) -> None:
        if self._bin is None:
            self._bin = postgres_bin_dir()
            if self._bin is None:
                raise PostgresNotInstalled(
                    "PostgreSQL is not installed (no initdb/pg_ctl): run `bash deploy/install-postgres.sh`"
                )
        command = [str(self._bin / tool), *args]
        if os.geteuid() == 0:
            command = (
                ["runuser", "-u", "postgres", "--", *command]
                if shutil.which("runuser")
                else ["su", "postgres", "-c", shlex.join(command)]
            )
        done = subprocess.run(command, cwd=self.data_dir, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise StackError(f"{tool} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
