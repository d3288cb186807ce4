"""Processes of this machine, which machine this is, and the state the role processes keep."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..settings import Settings


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


def role_states(settings: Settings) -> list[dict[str, Any]]:
    """The live state of every role process running under ``settings.home`` (listeners, requests
    made by kind, peak memory), as each keeps it in ``home/state/<role>-<pid>.json``."""
    states = []
    for path in sorted((settings.home / "state").glob("*-*.json")):
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced this instant
        if pid_alive(int(state["pid"])):
            states.append(state)
    return states
