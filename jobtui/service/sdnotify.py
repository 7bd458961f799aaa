"""systemd's notification protocol, for `Type=notify` units (deploy/systemd/): one datagram
per message on the AF_UNIX socket systemd names in NOTIFY_SOCKET. Nothing is sent without
it, so the same process runs anywhere else unchanged.

    notify("READY=1", "STATUS=worker w1 started")
    interval = watchdog_interval()      # half of WatchdogSec=, or None
"""

from __future__ import annotations

import asyncio
import os
import socket


def _address() -> str | None:
    path = os.environ.get("NOTIFY_SOCKET")
    if not path or not (path.startswith("/") or path.startswith("@")):
        return None
    # A leading @ names a socket in the abstract namespace: a NUL byte in its address.
    return "\0" + path[1:] if path.startswith("@") else path


def notify(*fields: str) -> bool:
    """Send `fields` (each `NAME=value`) to systemd; False when no unit asked for them or the
    socket would not take them (a notification is advice: the process goes on either way)."""
    address = _address()
    if address is None:
        return False
    message = "\n".join(field.replace("\n", " ") for field in fields).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message)
    except OSError:
        return False
    return True


def watchdog_interval() -> float | None:
    """How often to tell systemd the process is alive: half of the unit's WatchdogSec=
    (WATCHDOG_USEC), when its watchdog is on and meant for this process."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2_000_000


async def keep_watchdog(interval: float) -> None:
    """WATCHDOG=1 every `interval`, from the event loop itself: a loop that stops answering
    stops these too, and systemd restarts the process. A database outage does not stop
    them, since a restart would not bring the database back."""
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
