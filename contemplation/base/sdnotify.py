"""``sd_notify`` for ``Type=notify`` units, without a dependency.

Sends datagrams such as ``READY=1``, ``WATCHDOG=1`` and ``STOPPING=1`` to ``$NOTIFY_SOCKET``
(a path, or ``@name`` for the abstract namespace). Everything is a no-op outside systemd.
"""

from __future__ import annotations

import os
import socket


def notify(*states: str) -> bool:
    addr = os.environ.get("NOTIFY_SOCKET", "")
    if not addr:
        return False
    if addr.startswith("@"):
        target = "\0" + addr[1:]
    elif addr.startswith("/"):
        target = addr
    else:
        return False  # vsock and other schemes are not used by user services
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(target)
            s.sendall("\n".join(states).encode())
    except OSError:
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``WatchdogSec``), or None when unset."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None
