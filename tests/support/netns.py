"""A network namespace with nothing but loopback, for tests that must not reach any other address.

Inside :func:`loopback_only` the calling thread (and every thread and process it starts: Azurite,
the role processes, the ``billing`` commands) has one network interface, ``lo``, and no route:
a connection to any address outside 127.0.0.0/8 (the instance metadata service 169.254.169.254
included) fails at once with ``ENETUNREACH`` in the kernel, whatever the code asking. Creating
one needs ``CAP_SYS_ADMIN`` (root, as in CI); :class:`NamespaceRefused` says when it is missing.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000  # <sched.h>; os.unshare/os.setns arrive only in Python 3.12
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1  # <linux/sockios.h>, <net/if.h>
IFREQ = struct.Struct("16sH22x")  # struct ifreq: the name, then ifr_flags in a 24-byte union
THIS_THREAD = "/proc/thread-self/ns/net"


class NamespaceRefused(OSError):
    """The kernel refused a new network namespace (no ``CAP_SYS_ADMIN``, or namespaces disabled)."""


def namespace_of(pid: int | str = "thread-self") -> str:
    """The network namespace of a process (or of the calling thread), e.g. ``net:[4026532177]``."""
    path = THIS_THREAD if pid == "thread-self" else f"/proc/{pid}/ns/net"
    return os.readlink(path)


@contextmanager
def loopback_only() -> Iterator[str]:
    """Move the calling thread into a new network namespace with only ``lo`` (up) for the block,
    then back; yields the namespace's name (see :func:`namespace_of`). Start what must run inside
    (servers' sockets, threads, subprocesses) from this thread, inside the block."""
    libc = ctypes.CDLL(None, use_errno=True)
    original = os.open(THIS_THREAD, os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise NamespaceRefused(code, f"cannot create a network namespace: {os.strerror(code)}")
        try:
            _loopback_up()
            yield namespace_of()
        finally:
            if libc.setns(original, CLONE_NEWNET) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"cannot return to the original network namespace: {os.strerror(code)}")
    finally:
        os.close(original)


def unreachable(host: str, port: int = 80) -> bool:
    """Whether the kernel refuses to route a connection to ``host`` (``ENETUNREACH``), rather than
    the host merely not answering."""
    try:
        with socket.create_connection((host, port), timeout=5):
            return False
    except OSError as exc:
        return exc.errno == errno.ENETUNREACH


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        _, flags = IFREQ.unpack(fcntl.ioctl(sock, SIOCGIFFLAGS, IFREQ.pack(b"lo", 0)))
        fcntl.ioctl(sock, SIOCSIFFLAGS, IFREQ.pack(b"lo", flags | IFF_UP))
