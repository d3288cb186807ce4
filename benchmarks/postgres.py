"""A throwaway local PostgreSQL server for ``billing soak``, from the machine's PostgreSQL binaries
(``bash deploy/install-postgres.sh`` installs them): trust auth, TCP on 127.0.0.1 only, fsync off.
As root the cluster is owned by and run as the ``postgres`` user (``runuser``), so every parent of
its data directory must be traversable by that user (``/tmp/<mkdtemp>`` is)."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from pathlib import Path

from shared.localstack import StackError, free_ports


def bin_dir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: the newest ``/usr/lib/postgresql/*/bin``, else ``PATH``."""
    found = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb") if p.with_name("pg_ctl").exists()]
    if found:
        return max(found, key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.name)] or [0])
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb and shutil.which("pg_ctl") else None


class LocalPostgres:
    """One cluster in ``data_dir`` on a free port: :meth:`start` (creating it the first time), :meth:`stop`."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_ports(1)[0]
        self.log_file = data_dir / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> str:
        """Start the server (initdb first if needed); its SQLAlchemy URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not (self.data_dir / "PG_VERSION").exists():
            self._own()
            self._run("initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust", "--no-sync")
        sockets = self.data_dir / "sockets"
        sockets.mkdir(exist_ok=True)
        self._own()
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {sockets} -c fsync=off"
        self._run(
            "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60", "-o", options, "start"
        )
        return self.url

    def stop(self) -> None:
        """Fast shutdown (open sessions are ended); idempotent."""
        if (self.data_dir / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")

    def _own(self) -> None:
        if os.geteuid() != 0:
            return
        try:
            user = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise StackError("running as root needs a `postgres` user: run `bash deploy/install-postgres.sh`") from exc
        for path in [self.data_dir, *self.data_dir.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)

    def _run(self, tool: str, *args: str) -> None:
        where = bin_dir()
        if where is None:
            raise StackError("PostgreSQL is not installed (no initdb/pg_ctl): run `bash deploy/install-postgres.sh`")
        command = [str(where / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, cwd=self.data_dir, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise StackError(f"{tool} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")
