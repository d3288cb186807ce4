"""Separate hosts for a test, on one machine: a network namespace each, all on one virtual Ethernet
bridge, each with its own address (``10.77.0.<n>/24``) and its own loopback.

The bridge lives in a namespace of its own too, so nothing is added to the machine's network: the
test's addresses exist only inside the namespaces. Every name carries a random tag (several runs
may build networks at once) and everything is removed when the block ends, whatever happened in it;
processes still running in a host namespace keep it alive, so stop them first. Needs root
(``ip netns``, ``ip link``); :class:`HostsRefused` says when they are not allowed.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

SUBNET = "10.77.0"  # a /24 that exists only inside the namespaces made here


class HostsRefused(OSError):
    """``ip netns`` / ``ip link`` are missing or not permitted (not root)."""


@dataclass(frozen=True)
class Host:
    """One test host: a network namespace and its address on the bridge."""

    name: str
    netns: str
    address: str

    def command(self, args: Sequence[str]) -> list[str]:
        """``args`` as a command line that runs on this host (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.netns, *args]


@contextmanager
def hosts(*names: str) -> Iterator[dict[str, Host]]:
    """Hosts ``names`` on one bridge for the block, by name; removed after it."""
    if shutil.which("ip") is None:
        raise HostsRefused("the ip command (iproute2) is not installed")
    tag = f"bt{uuid.uuid4().hex[:6]}"
    switch = f"{tag}-switch"
    made: list[str] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        found = {}
        for number, name in enumerate(names, start=1):
            host = found[name] = Host(name=name, netns=f"{tag}-{name}", address=f"{SUBNET}.{number}")
            _ip("netns", "add", host.netns)
            made.append(host.netns)
            port = f"port{number}"
            _ip("link", "add", "eth0", "netns", host.netns, "type", "veth", "peer", "name", port, "netns", switch)
            _ip("-n", switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
        yield found
    finally:
        for netns in reversed(made):  # a namespace's interfaces go with it (each veth pair with either end)
            subprocess.run(["ip", "netns", "delete", netns], capture_output=True, check=False)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HostsRefused(f"ip {' '.join(args)}: {done.stderr.strip()}")
