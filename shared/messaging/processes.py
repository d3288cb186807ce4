"""Processes of this machine, and which machine this is."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] != "Z"
    return True


def machine_identity() -> str:
    """Which machine and network namespace this process runs in (its boot id and the namespace's
    inode): processes with the same identity share one loopback interface and one process table."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:  # no procfs: the host name is the best there is
        return socket.gethostname()
